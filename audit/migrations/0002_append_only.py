"""The audit log is append-only in the database too: a row trigger refuses UPDATE and DELETE
on ``audit_auditentry`` from any client (the ORM also refuses: audit/models.py).

Account deletion needs no exception to it: entries hold ids, never names (audit/models.py), so
nothing in them is ever rewritten. TRUNCATE is not a row operation and stays the table owner's
(tests flush their database with it); to keep the application itself from erasing the log,
run it as a role with INSERT and SELECT only on this table.
"""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION audit_entry_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_auditentry is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER audit_entry_append_only
    BEFORE UPDATE OR DELETE ON audit_auditentry
    FOR EACH ROW EXECUTE FUNCTION audit_entry_append_only();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS audit_entry_append_only ON audit_auditentry;
DROP FUNCTION IF EXISTS audit_entry_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
