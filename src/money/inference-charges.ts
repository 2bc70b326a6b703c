import type { Tx } from '../db/index.js';
import { postTransaction } from './ledger.js';
import { recordRunUsageTx, type RunUsage } from './rft.js';

export type { RunUsage };

export interface InferenceCharge {
  walletId: string;
  /** Positive: what the wallet owes, in units (USD x 10000). */
  amountUnits: number;
  refId: string;
  description: string;
}

/**
 * Posts a batch of inference charges inside the caller's transaction, with the RFT run
 * usage (X-RFT-Run-ID) of the same requests. Wallets are locked in id order,
 * so two flushes (two daemons on one database) never deadlock.
 */
export async function chargeInference(tx: Tx, items: InferenceCharge[], runs: RunUsage[] = []): Promise<void> {
  const sorted = [...items].sort((a, b) => (a.walletId < b.walletId ? -1 : a.walletId > b.walletId ? 1 : 0));
  for (const it of sorted) {
    await postTransaction(tx, {
      walletId: it.walletId,
      amount: -it.amountUnits,
      type: 'INFERENCE_CHARGE',
      description: it.description,
      refType: 'model',
      refId: it.refId,
    });
  }
  await recordRunUsageTx(tx, runs);
}
