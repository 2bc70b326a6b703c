import { z } from 'zod';
import { PERMISSIONS } from './principal.js';

// Admin issuance of principals (DESIGN.md "Issuing principals"): request schemas.

const email = z.string().trim().toLowerCase().email('must be an email address').max(254);

export const CreateUserBody = z.object({
  name: z.string().trim().min(1, 'must not be empty').max(200, 'must be at most 200 characters'),
  email,
});

export const CreateTeamBody = z.object({
  name: z.string().trim().min(1, 'must not be empty').max(200, 'must be at most 200 characters'),
  slug: z
    .string()
    .regex(/^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$/, 'must be 1 to 64 lowercase letters, digits and inner dashes')
    .nullish(),
  email: email.nullish(),
});

/** A member's role in a team (CHECK in migrations/001_core.sql). */
export const TEAM_ROLES = ['ADMIN', 'MEMBER'] as const;

export const AddMemberBody = z.object({
  userId: z.string().min(1, 'must not be empty'),
  role: z.enum(TEAM_ROLES).default('MEMBER'),
});

const perMinute = z.number().int('must be an integer').min(0, 'must be >= 0').max(1e9, 'must be <= 1000000000');

export const RateLimitsBody = z
  .object({ requestsPerMinute: perMinute.nullish(), tokensPerMinute: perMinute.nullish() })
  .strict();

/** PATCH /api/admin/api-keys/{keyId}: the key's own limits; null goes back to the defaults. */
export const PatchKeyBody = z.object({ rateLimits: RateLimitsBody.nullable() }).strict();

export const CreateKeyBody = z.object({
  userId: z.string().min(1, 'must not be empty'),
  permissions: z
    .array(z.enum(PERMISSIONS, { message: `must be one of ${PERMISSIONS.join(', ')}` }))
    .min(1, 'must list at least one permission')
    .max(PERMISSIONS.length),
  name: z.string().max(200, 'must be at most 200 characters').nullish(),
  rateLimits: RateLimitsBody.nullish(),
});

// ---------------------------------------------------------------- answers
// Response schemas: /openapi.json is generated from them and the end-to-end suite checks
// every answer against them (CHECK_RESPONSE_SCHEMAS). Comments name where each is built.

// =============================================================== auth issuance (auth/routes.ts, auth/issuance.ts)
// All enveloped `{ data, status: 'success' }` (auth/routes.ts).

/** auth/principal.ts; keys are written only through CreateKeyBody's enum or bootstrapAdmin (['admin:*']). */
export const Permission = z.enum(PERMISSIONS);

/**
 * A key's own rate limits (issuance.ts stripNulls): only the keys that were sent non-null
 * are present, so `{}` is possible; null when none were set (and for the bootstrap key).
 */
export const RateLimits = z.object({
  requestsPerMinute: z.number().int().optional(),
  tokensPerMinute: z.number().int().optional(),
});

/** POST /api/admin/users: issuance.ts. */
export const User = z.object({
  id: z.string(),
  name: z.string(),
  email: z.string(),
  createdAt: z.string(),
  walletId: z.string(),
});

/** POST /api/admin/teams: issuance.ts. */
export const Team = z.object({
  id: z.string(),
  name: z.string(),
  slug: z.string(),
  email: z.string().nullable(),
  hasBetaAccess: z.literal(false), // always false on creation
  createdAt: z.string(),
  walletId: z.string(),
});

/** POST /api/admin/teams/:teamId/members: issuance.ts. */
export const Membership = z.object({
  teamId: z.string(),
  userId: z.string(),
  role: z.enum(TEAM_ROLES),
  joinedAt: z.string(),
});

/** POST /api/admin/api-keys: issuance.ts. The only answer carrying the secret `key`. */
export const IssuedKey = z.object({
  id: z.string(),
  key: z.string(),
  userId: z.string(),
  name: z.string().nullable(),
  permissions: z.array(Permission),
  rateLimits: RateLimits.nullable(),
  createdAt: z.string(),
});

/** PATCH /api/admin/api-keys/:keyId: issuance.ts (not the full key view). */
export const KeyRateLimitsSet = z.object({
  id: z.string(),
  userId: z.string(),
  rateLimits: RateLimits.nullable(),
});

/** issuance.ts keyView: DELETE /api/admin/api-keys/:keyId and list items. */
export const ApiKey = z.object({
  id: z.string(),
  userId: z.string(),
  name: z.string().nullable(),
  prefix: z.string(),
  permissions: z.array(Permission),
  rateLimits: RateLimits.nullable(),
  createdAt: z.string(),
  revokedAt: z.string().nullable(), // always a string on DELETE
});
/** GET /api/admin/users/:userId/api-keys: issuance.ts (bare array inside data). */
export const ApiKeyList = z.array(ApiKey);

