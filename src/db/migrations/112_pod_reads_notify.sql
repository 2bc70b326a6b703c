-- Pod lists are cached in memory by every daemon (src/platform/pod-reads.ts).
-- These statement triggers tell them, at commit, that something a list shows
-- may have changed: a pod's record, owner, team, sharing or termination, a
-- team membership, or a per-user share. Updates of other pod columns (the
-- reconciler's poll schedule) do not notify.
CREATE FUNCTION notify_pod_reads() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('cloudgate_pod_reads', '');
  RETURN NULL;
END $$;

CREATE TRIGGER pods_reads_insert_delete AFTER INSERT OR DELETE ON pods
  FOR EACH STATEMENT EXECUTE FUNCTION notify_pod_reads();
CREATE TRIGGER pods_reads_update AFTER UPDATE OF doc, terminated_at, user_id, team_id, shared_with_team ON pods
  FOR EACH STATEMENT EXECUTE FUNCTION notify_pod_reads();
CREATE TRIGGER team_members_reads AFTER INSERT OR UPDATE OR DELETE ON team_members
  FOR EACH STATEMENT EXECUTE FUNCTION notify_pod_reads();
CREATE TRIGGER pod_shares_reads AFTER INSERT OR UPDATE OR DELETE ON pod_shares
  FOR EACH STATEMENT EXECUTE FUNCTION notify_pod_reads();
