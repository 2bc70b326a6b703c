-- Every daemon caches API-key lookups, misses included (src/auth/authenticator.ts).
-- This statement trigger tells them all, at commit, that a key was issued,
-- revoked or changed (permissions, rate limits), so a revocation takes effect
-- on every replica within a notification's delay instead of the cache's life.
CREATE FUNCTION notify_api_keys() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('cloudgate_api_keys', '');
  RETURN NULL;
END $$;

CREATE TRIGGER api_keys_changed AFTER INSERT OR UPDATE OR DELETE ON api_keys
  FOR EACH STATEMENT EXECUTE FUNCTION notify_api_keys();
