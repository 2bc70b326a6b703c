import type { Sql, Tx } from '../db/index.js';
import { ApiError, conflict } from '../errors.js';
import { idempotent, requestHash, type Answer } from './idempotency.js';
import { postTransaction, unitsToUsd } from './ledger.js';
import type { TopupBody } from './protocol.js';

// Admin top-up and refund (SPEC 4.7): TOPUP credits, REFUND debits, amounts
// in units (USD x 10000) in the request and in the answer.

const ROUTE = 'POST /api/admin/transactions/topup';

/** The owner's wallet, or a 404 naming the owner field. */
async function ownerWallet(tx: Tx, owner: { userId?: string | null; teamId?: string | null }): Promise<string> {
  const param = owner.teamId ? 'teamId' : 'userId';
  const value = owner.teamId ?? owner.userId!;
  const [w] = owner.teamId
    ? await tx<{ id: string }[]>`SELECT id FROM wallets WHERE team_id = ${owner.teamId}`
    : await tx<{ id: string }[]>`SELECT id FROM wallets WHERE user_id = ${owner.userId!}`;
  if (!w) throw new ApiError('not_found', `${param}: no ${param === 'teamId' ? 'team' : 'user'} ${JSON.stringify(value)}`, { param });
  return w.id;
}

/**
 * Credits or debits a wallet. A REFUND may take the balance down to zero but
 * not below: it returns money the customer has, and never creates a debt.
 */
export async function topup(sql: Sql, callerId: string, b: TopupBody, key: string | null): Promise<Answer> {
  const normalised = { amount: b.amount, type: b.type, userId: b.userId ?? null, teamId: b.teamId ?? null, description: b.description ?? null };
  return idempotent(sql, `${callerId} ${ROUTE}`, key, requestHash(normalised), async (tx) => {
    const walletId = await ownerWallet(tx, b);
    if (b.type === 'REFUND') {
      const [w] = await tx<{ balance: number }[]>`SELECT balance FROM wallets WHERE id = ${walletId} FOR UPDATE`;
      if (w!.balance < b.amount) {
        throw conflict(
          `amount: a REFUND of ${b.amount} units exceeds the wallet's balance of ${w!.balance} units (${unitsToUsd(w!.balance)} USD)`,
          'amount',
        );
      }
    }
    const posted = await postTransaction(tx, {
      walletId,
      amount: b.type === 'TOPUP' ? b.amount : -b.amount,
      type: b.type,
      description: b.description ?? null,
      refType: 'user',
      refId: callerId,
    });
    return {
      status: 200,
      body: {
        data: {
          walletId,
          balance: posted.balance,
          amount: posted.amount,
          type: posted.type,
          transactionId: posted.id,
          description: b.description ?? null,
          createdAt: posted.createdAt.toISOString(),
        },
        status: 'success',
      },
    };
  });
}
