"""On PostgreSQL, ``audit_append``: one call appends events to a chain (audit/services.py).

The writer canonicalises each event with its ``seq`` left out and passes the bytes before and
after it; the function locks the chain head, gives each event the next ``seq`` and
``hash = sha256(prev_hash || before || seq || after)`` (the version 2 hash of audit/chain.py,
byte for byte), inserts the events and moves the head, and returns each event's id, seq,
prev_hash and hash. Under READ COMMITTED a writer that waited for the head's lock reads the
head its predecessor committed, so concurrent appends still chain one after another.

The row values arrive as one jsonb array read with ``jsonb_populate_recordset`` into the
events' own row type: a migration that changes ``audit_auditevent``'s columns must recreate
this function.
"""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION audit_append(
    p_chain text, p_rows jsonb, p_before bytea[], p_after bytea[]
) RETURNS TABLE (
    new_id bigint, new_seq bigint, new_prev_hash varchar, new_hash varchar
) AS $$
DECLARE
    v_seq bigint;
    v_hash varchar;
    v_seqs bigint[] := '{}';
    v_prevs varchar[] := '{}';
    v_hashes varchar[] := '{}';
BEGIN
    SELECT h.seq, h.hash INTO v_seq, v_hash
        FROM audit_auditchainhead h WHERE h.chain = p_chain FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO audit_auditchainhead (chain, seq, hash)
            VALUES (p_chain, 0, repeat('0', 64)) ON CONFLICT (chain) DO NOTHING;
        SELECT h.seq, h.hash INTO STRICT v_seq, v_hash
            FROM audit_auditchainhead h WHERE h.chain = p_chain FOR UPDATE;
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_before, 1), 0) LOOP
        v_seq := v_seq + 1;
        v_seqs[i] := v_seq;
        v_prevs[i] := v_hash;
        v_hash := encode(sha256(
            convert_to(v_hash, 'UTF8') || p_before[i] || convert_to(v_seq::text, 'UTF8')
            || p_after[i]
        ), 'hex');
        v_hashes[i] := v_hash;
    END LOOP;
    UPDATE audit_auditchainhead h SET seq = v_seq, hash = v_hash WHERE h.chain = p_chain;
    RETURN QUERY
    INSERT INTO audit_auditevent AS e (
        chain, seq, occurred_at, organization_id, workspace_id, actor_type, actor_id,
        actor_token_id, actor_label, action, target_type, target_id, target_repr, changes,
        metadata, request_id, ip, user_agent, prev_hash, hash, hash_version
    )
    SELECT p_chain, c.seq, r.occurred_at, r.organization_id, r.workspace_id, r.actor_type,
        r.actor_id, r.actor_token_id, r.actor_label, r.action, r.target_type, r.target_id,
        r.target_repr, r.changes, r.metadata, r.request_id, r.ip, r.user_agent, c.prev, c.hash,
        r.hash_version
    FROM jsonb_populate_recordset(NULL::audit_auditevent, p_rows) WITH ORDINALITY AS r
    JOIN unnest(v_seqs, v_prevs, v_hashes) WITH ORDINALITY AS c (seq, prev, hash, n)
        ON c.n = r.ordinality
    ORDER BY c.n
    RETURNING e.id, e.seq, e.prev_hash, e.hash;
END
$$ LANGUAGE plpgsql;
"""

BACKWARD = "DROP FUNCTION IF EXISTS audit_append(text, jsonb, bytea[], bytea[]);"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0004_hash_version")]

    operations = [migrations.RunPython(forward, backward)]
