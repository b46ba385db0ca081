"""Audit entries that name a region's data keep their target id and details in that region's
database (``AuditDetail``; issue 20): the global row gets ``region``. The detail table is
append-only in the database too, as ``audit_auditentry`` is (0002); it is created in every
database that holds conversations, so its trigger function is created here as well."""

from django.db import migrations, models

FORWARD = """
CREATE OR REPLACE FUNCTION audit_detail_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_auditdetail is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER audit_detail_append_only
    BEFORE UPDATE OR DELETE ON audit_auditdetail
    FOR EACH ROW EXECUTE FUNCTION audit_detail_append_only();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS audit_detail_append_only ON audit_auditdetail;
DROP FUNCTION IF EXISTS audit_detail_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0002_append_only")]

    operations = [
        migrations.AddField(
            model_name="auditentry",
            name="region",
            field=models.CharField(blank=True, default="", max_length=32),
        ),
        migrations.CreateModel(
            name="AuditDetail",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("entry_id", models.BigIntegerField(unique=True)),
                ("target_id", models.CharField(blank=True, max_length=64)),
                ("details", models.JSONField(blank=True, default=dict)),
            ],
            options={"verbose_name": "audit entry's regional detail"},
        ),
        # The hint names the model, so region databases (which get only regional models of
        # this app: core/dbrouter.py allow_migrate) run it with the table they have.
        migrations.RunSQL(FORWARD, BACKWARD, hints={"model_name": "auditdetail"}),
    ]
