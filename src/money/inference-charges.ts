import type { Sql, Tx } from '../db/index.js';
import { postTransaction } from './ledger.js';

export interface InferenceCharge {
  walletId: string;
  /** Positive: what the wallet owes, in units (USD x 10000). */
  amountUnits: number;
  refId: string;
  description: string;
}

export interface RunUsage {
  runId: string;
  input: number;
  output: number;
}

/**
 * Posts a batch of inference charges in one transaction. Wallets are locked in
 * id order, so two flushes (two daemons on one database) never deadlock.
 */
export async function chargeInference(sql: Sql, items: InferenceCharge[], runs: RunUsage[] = []): Promise<void> {
  const sorted = [...items].sort((a, b) => (a.walletId < b.walletId ? -1 : a.walletId > b.walletId ? 1 : 0));
  await sql.begin(async (tx) => {
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
    await recordRunUsage(tx, runs);
  });
}

// Attribution of inference usage to RFT runs; the runs tables belong to rft.ts.
let recordRunUsage: (tx: Tx, runs: RunUsage[]) => Promise<void> = async (_tx, runs) => {
  if (runs.length) throw new Error('RFT run usage recording is not wired (src/money/rft.ts)');
};

export function setRunUsageRecorder(fn: typeof recordRunUsage): void {
  recordRunUsage = fn;
}
