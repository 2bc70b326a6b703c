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

export const AddMemberBody = z.object({
  userId: z.string().min(1, 'must not be empty'),
  role: z.enum(['ADMIN', 'MEMBER']).default('MEMBER'),
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
