-- The pod's list-form record (SPEC 2.1) as JSON text, rewritten in the same
-- transaction as every change to the pod or its attachments. The list and get
-- routes send it as stored: building ~50 fields per pod on every read cost
-- more than the rest of the request (bench/README.md).
ALTER TABLE pods ADD COLUMN doc text;
