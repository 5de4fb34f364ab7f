-- Views every command sees. The raw tables (span_rows, step_rows, message_rows, capture_stats,
-- and the job tables) are views over one snapshot of the store's Parquet segments (the segments
-- listed when the connection opened, minus those a committed compaction replaced: see
-- otel_replay/store/snapshot.py), created by otel_replay.store.catalog before these run. So a raw
-- table counts each stored row once, even while a compaction runs.

-- name: spans
-- One row per span; a span stored twice (re-import, retry) counts once, the newest wins.
CREATE OR REPLACE TEMP VIEW spans AS
SELECT * EXCLUDE (rn) FROM (
    SELECT *, row_number() OVER (PARTITION BY trace_id, span_id ORDER BY ingested_ns DESC) AS rn
    FROM span_rows
) WHERE rn = 1;

-- name: steps
-- One row per step. The spans of one model call (an instrumentation's span and the SDK's own span,
-- nested or siblings; a framework's LLM span over either) collapse to one step. The rule (README,
-- "Conventions understood"): two llm (or embedding) steps of a trace are one call when their
-- times overlap, they come from different producers (instrumentation scope and convention), have
-- the same operation and a compatible provider, share a model (request or response; a step with no
-- model at all only with its direct parent or child, or with the same request), and at most one
-- carries payloads or both carry the same input messages. A step pairs with at most one step of
-- each other producer, the closest in time, in rounds of mutual best matches, so two calls of one
-- producer never share a step. The kept row is the first by pref (payloads, more payload parts,
-- outermost); its empty values are filled from its partners in that order; status is the worst,
-- the time the union; `span_ids` lists the spans, the kept one first.
-- step_index numbers the intervention targets (every kind but agent) by start time, from 0.
CREATE OR REPLACE TEMP VIEW steps AS
WITH latest AS MATERIALIZED (
    SELECT * EXCLUDE (rn) FROM (
        SELECT *, row_number() OVER (PARTITION BY trace_id, span_id ORDER BY ingested_ns DESC) AS rn
        FROM step_rows
    ) WHERE rn = 1
),
-- Model calls of the traces (and kinds) in which two model calls overlap: the only ones that can
-- be duplicates (a sequential agent has none, and what follows sees no row). Some two calls
-- overlap exactly when some call overlaps the next one to start, so one narrow window finds them.
-- pref: the order in which a call's spans give their values (payloads, more payload parts, outer);
-- nth: the position among its convention's calls, to pair calls of identical timing in order.
parallel AS NOT MATERIALIZED (
    SELECT DISTINCT trace_id, kind FROM (
        SELECT trace_id, kind,
               end_ns >= lead(start_ns) OVER (PARTITION BY trace_id, kind ORDER BY start_ns, span_id) AS overlaps_next
        FROM latest
        WHERE kind IN ('llm', 'embedding') AND start_ns IS NOT NULL AND end_ns IS NOT NULL
    ) WHERE overlaps_next
),
overlapping AS NOT MATERIALIZED (
    SELECT trace_id, span_id, parent_span_id, kind, operation, provider, request_model, response_model,
           start_ns, end_ns, has_payload, input_hashes, convention,
           {'observation_only': NOT has_payload,
            'fewer_parts': -(coalesce(len(input_hashes), 0) + coalesce(len(output_hashes), 0)
                             + (system_hash IS NOT NULL)::INT + (tools_hash IS NOT NULL)::INT),
            'start_ns': start_ns, 'end_ns': -end_ns, 'span_id': span_id} AS pref,
           row_number() OVER (PARTITION BY trace_id, kind, convention ORDER BY start_ns, end_ns, span_id) AS nth
    FROM latest JOIN parallel USING (trace_id, kind)
    WHERE start_ns IS NOT NULL AND end_ns IS NOT NULL
),
-- The producer of a call: the instrumentation scope of its span and the adapter that read it.
calls AS NOT MATERIALIZED (
    SELECT * EXCLUDE (rn) FROM (
        SELECT o.*, coalesce(s.scope_name, '') || ' ' || o.convention AS producer,
               row_number() OVER (PARTITION BY o.trace_id, o.span_id ORDER BY s.ingested_ns DESC NULLS LAST) AS rn
        FROM overlapping o JOIN span_rows s ON s.trace_id = o.trace_id AND s.span_id = o.span_id
    ) WHERE rn = 1
),
-- Candidate pairs, listed both ways. a_side and b_side name a's candidates of b's producer and b's
-- of a's (the partitions of the rounds below; a hash sorts faster than the ids it stands for).
pairs AS (
    SELECT a.trace_id, a.span_id AS a_id, b.span_id AS b_id, a.producer AS a_producer, b.producer AS b_producer,
           hash(a.trace_id, a.span_id, b.producer) AS a_side, hash(a.trace_id, b.span_id, a.producer) AS b_side,
           a.pref AS a_pref, b.pref AS b_pref,
           abs(a.start_ns - b.start_ns) + abs(a.end_ns - b.end_ns) AS gap,
           abs(a.nth - b.nth) AS nth_gap
    FROM calls a JOIN calls b
      ON a.trace_id = b.trace_id AND a.kind = b.kind AND a.producer <> b.producer
     AND a.start_ns <= b.end_ns AND b.start_ns <= a.end_ns
    WHERE a.operation IS NOT DISTINCT FROM b.operation
      AND coalesce(lower(a.provider) = lower(b.provider), true)
      AND (NOT (a.has_payload AND b.has_payload) OR a.input_hashes IS NOT DISTINCT FROM b.input_hashes)
      AND coalesce(CASE
          WHEN (a.request_model IS NULL AND a.response_model IS NULL)
            OR (b.request_model IS NULL AND b.response_model IS NULL)
          THEN a.parent_span_id = b.span_id OR b.parent_span_id = a.span_id
            OR (a.has_payload AND b.has_payload AND len(a.input_hashes) > 0)
          ELSE a.request_model IN (b.request_model, b.response_model)
            OR a.response_model IN (b.request_model, b.response_model)
      END, false)
),
-- Rounds of mutual best matches over the pairs (listed both ways): a free pair is matched when
-- each is the other's closest free candidate of the other's producer ("done": already matched
-- to that producer in an earlier round). Three rounds settle calls of near-identical timing.
round1 AS (
    SELECT *, coalesce(row_number() OVER (PARTITION BY trace_id, a_side ORDER BY gap, nth_gap, b_id) = 1
                       AND row_number() OVER (PARTITION BY trace_id, b_side ORDER BY gap, nth_gap, a_id) = 1,
                       false) AS m1
    FROM pairs
),
round2 AS (
    SELECT *, NOT done AND row_number() OVER (PARTITION BY trace_id, a_side ORDER BY done, gap, nth_gap, b_id) = 1
              AND row_number() OVER (PARTITION BY trace_id, b_side ORDER BY done, gap, nth_gap, a_id) = 1 AS m2
    FROM (
        SELECT *, bool_or(m1) OVER (PARTITION BY trace_id, a_side)
                  OR bool_or(m1) OVER (PARTITION BY trace_id, b_side) AS done
        FROM round1
    )
),
round3 AS (
    SELECT * EXCLUDE (done), NOT done AND row_number() OVER (PARTITION BY trace_id, a_side ORDER BY done, gap, nth_gap, b_id) = 1
              AND row_number() OVER (PARTITION BY trace_id, b_side ORDER BY done, gap, nth_gap, a_id) = 1 AS m3
    FROM (
        SELECT * EXCLUDE (done), bool_or(m1 OR m2) OVER (PARTITION BY trace_id, a_side)
                  OR bool_or(m1 OR m2) OVER (PARTITION BY trace_id, b_side) AS done
        FROM round2
    )
),
-- Per matched step, its partners' values in pref order. A step is kept when it comes before all
-- of its partners; the others are folded into a partner that comes before them.
partners AS (
    SELECT m.trace_id, m.a_id AS span_id,
           min(b_pref) > any_value(a_pref) AS kept,
           list(b_id ORDER BY b_pref) AS span_ids,
           min(b.start_ns) AS start_ns,
           max(b.end_ns) AS end_ns,
           CASE WHEN bool_or(b.status = 'error') THEN 'error' WHEN bool_or(b.status = 'ok') THEN 'ok' END AS status,
           arg_min(b.error_type, b_pref) FILTER (WHERE b.error_type IS NOT NULL) AS error_type,
           arg_min(b.error_message, b_pref) FILTER (WHERE b.error_message IS NOT NULL) AS error_message,
           arg_min(b.provider, b_pref) FILTER (WHERE b.provider IS NOT NULL) AS provider,
           arg_min(b.request_model, b_pref) FILTER (WHERE b.request_model IS NOT NULL) AS request_model,
           arg_min(b.response_model, b_pref) FILTER (WHERE b.response_model IS NOT NULL) AS response_model,
           arg_min(b.input_tokens, b_pref) FILTER (WHERE b.input_tokens IS NOT NULL) AS input_tokens,
           arg_min(b.output_tokens, b_pref) FILTER (WHERE b.output_tokens IS NOT NULL) AS output_tokens,
           arg_min(b.agent_name, b_pref) FILTER (WHERE b.agent_name IS NOT NULL) AS agent_name,
           arg_min(b.conversation_id, b_pref) FILTER (WHERE b.conversation_id IS NOT NULL) AS conversation_id,
           arg_min(b.system_hash, b_pref) FILTER (WHERE b.system_hash IS NOT NULL) AS system_hash,
           arg_min(b.tools_hash, b_pref) FILTER (WHERE b.tools_hash IS NOT NULL) AS tools_hash,
           arg_min(b.output_hashes, b_pref) FILTER (WHERE len(b.output_hashes) > 0) AS output_hashes,
           arg_min(b.request_params, b_pref) FILTER (WHERE b.request_params IS NOT NULL) AS request_params,
           arg_min(b.finish_reasons, b_pref) FILTER (WHERE len(b.finish_reasons) > 0) AS finish_reasons,
           bool_or(b.has_payload) AS has_payload,
           flatten(list(b.redacted) FILTER (WHERE b.redacted IS NOT NULL)) AS redacted
    FROM round3 m JOIN latest b ON b.trace_id = m.trace_id AND b.span_id = m.b_id
    WHERE m1 OR m2 OR m3
    GROUP BY m.trace_id, m.a_id
),
collapsed AS (
    SELECT l.* REPLACE (
               CASE WHEN l.name = l.operation AND l.request_model IS NULL AND l.response_model IS NULL
                         AND coalesce(p.request_model, p.response_model) IS NOT NULL
                    THEN l.operation || ' ' || coalesce(p.request_model, p.response_model)
                    ELSE l.name END AS name,
               least(l.start_ns, p.start_ns) AS start_ns,
               greatest(l.end_ns, p.end_ns) AS end_ns,
               CASE WHEN p.status = 'error' OR p.status = 'ok' AND l.status <> 'error' THEN p.status
                    ELSE l.status END AS status,
               coalesce(l.error_type, p.error_type) AS error_type,
               coalesce(l.error_message, p.error_message) AS error_message,
               coalesce(l.provider, p.provider) AS provider,
               coalesce(l.request_model, p.request_model) AS request_model,
               coalesce(l.response_model, p.response_model) AS response_model,
               coalesce(l.input_tokens, p.input_tokens) AS input_tokens,
               coalesce(l.output_tokens, p.output_tokens) AS output_tokens,
               coalesce(l.agent_name, p.agent_name) AS agent_name,
               coalesce(l.conversation_id, p.conversation_id) AS conversation_id,
               coalesce(l.system_hash, p.system_hash) AS system_hash,
               coalesce(l.tools_hash, p.tools_hash) AS tools_hash,
               CASE WHEN len(l.output_hashes) > 0 OR p.output_hashes IS NULL THEN l.output_hashes
                    ELSE p.output_hashes END AS output_hashes,
               coalesce(l.request_params, p.request_params) AS request_params,
               CASE WHEN len(l.finish_reasons) > 0 OR p.finish_reasons IS NULL THEN l.finish_reasons
                    ELSE p.finish_reasons END AS finish_reasons,
               l.has_payload OR coalesce(p.has_payload, false) AS has_payload,
               CASE WHEN p.redacted IS NULL THEN l.redacted
                    ELSE list_sort(list_distinct(coalesce(l.redacted, []) || p.redacted)) END AS redacted
           ),
           CASE WHEN p.span_id IS NULL THEN [l.span_id] ELSE [l.span_id] || p.span_ids END AS span_ids
    FROM latest l LEFT JOIN partners p USING (trace_id, span_id)
    WHERE p.span_id IS NULL OR p.kept
)
SELECT * EXCLUDE (span_ids),
       (NOT has_payload AND kind <> 'agent') AS observation_only,
       CASE WHEN kind <> 'agent' THEN
           row_number() OVER (PARTITION BY trace_id, kind = 'agent' ORDER BY start_ns, span_id) - 1
       END AS step_index,
       (end_ns - start_ns) / 1e6 AS duration_ms,
       span_ids
FROM collapsed;

-- name: messages
-- Each payload once, by content address.
CREATE OR REPLACE TEMP VIEW messages AS
SELECT hash, any_value(kind) AS kind, any_value(role) AS role, any_value(body) AS body
FROM message_rows
GROUP BY hash;

-- name: traces
-- One row per trace. status is 'error' when the root span failed or the last step failed.
CREATE OR REPLACE TEMP VIEW traces AS
WITH sp AS (
    SELECT trace_id,
           min(start_ns) AS start_ns,
           max(end_ns) AS end_ns,
           first(span_id ORDER BY parent_span_id IS NOT NULL, start_ns) AS root_span_id,
           first(name ORDER BY parent_span_id IS NOT NULL, start_ns) AS root_name,
           first(status_code ORDER BY parent_span_id IS NOT NULL, start_ns) AS root_status,
           first(service_name ORDER BY parent_span_id IS NOT NULL, start_ns) AS service_name,
           min(day) AS day,
           count(*) AS spans
    FROM spans
    GROUP BY trace_id
),
st AS (
    SELECT trace_id,
           count(*) FILTER (WHERE kind <> 'agent') AS steps,
           count(*) FILTER (WHERE kind = 'llm') AS llm_steps,
           count(*) FILTER (WHERE kind = 'tool') AS tool_steps,
           count(*) FILTER (WHERE status = 'error' AND kind <> 'agent') AS error_steps,
           count(*) FILTER (WHERE observation_only) AS observation_only_steps,
           sum(input_tokens) FILTER (WHERE kind = 'llm')::BIGINT AS input_tokens,
           sum(output_tokens) FILTER (WHERE kind = 'llm')::BIGINT AS output_tokens,
           last(status ORDER BY start_ns) FILTER (WHERE kind <> 'agent') AS last_step_status
    FROM steps
    GROUP BY trace_id
)
SELECT sp.trace_id,
       make_timestamp(sp.start_ns // 1000) AS start,
       (sp.end_ns - sp.start_ns) / 1e6 AS duration_ms,
       sp.root_name,
       sp.root_span_id,
       sp.service_name,
       coalesce(st.steps, 0) AS steps,
       coalesce(st.llm_steps, 0) AS llm_steps,
       coalesce(st.tool_steps, 0) AS tool_steps,
       coalesce(st.error_steps, 0) AS error_steps,
       coalesce(st.observation_only_steps, 0) AS observation_only_steps,
       CASE WHEN sp.root_status = 'error' OR st.last_step_status = 'error' THEN 'error' ELSE 'ok' END AS status,
       st.input_tokens,
       st.output_tokens,
       coalesce(st.input_tokens, 0) + coalesce(st.output_tokens, 0) AS tokens,
       sp.spans,
       sp.start_ns,
       sp.day
FROM sp LEFT JOIN st USING (trace_id);

-- name: capture_health
-- The latest counters of each capturing process.
CREATE OR REPLACE TEMP VIEW capture_health AS
SELECT host, pid,
       max(written_ns) AS written_ns,
       arg_max(accepted, written_ns) AS accepted,
       arg_max(dropped_queue_full, written_ns) AS dropped_queue_full,
       arg_max(skipped, written_ns) AS skipped,
       arg_max(skip_reasons, written_ns) AS skip_reasons
FROM capture_stats
GROUP BY host, pid;

-- name: jobs
-- Each attribution job's latest state.
CREATE OR REPLACE TEMP VIEW jobs AS
SELECT * EXCLUDE (rn) FROM (
    SELECT *, row_number() OVER (PARTITION BY job_id ORDER BY updated_ns DESC) AS rn FROM job_rows
) WHERE rn = 1;

-- name: rollouts
-- One row per rollout (a rollout written twice by a crash-and-resume counts once).
CREATE OR REPLACE TEMP VIEW rollouts AS
SELECT * EXCLUDE (rn) FROM (
    SELECT *, row_number() OVER (PARTITION BY job_id, trace_id, plan, rollout ORDER BY digest) AS rn FROM rollout_rows
) WHERE rn = 1;

-- name: results
CREATE OR REPLACE TEMP VIEW results AS
SELECT * EXCLUDE (rn) FROM (
    SELECT *, row_number() OVER (PARTITION BY job_id, trace_id, step_index, method ORDER BY culprit DESC) AS rn
    FROM result_rows
) WHERE rn = 1;

-- name: reports
CREATE OR REPLACE TEMP VIEW reports AS
SELECT * EXCLUDE (rn) FROM (
    SELECT *, row_number() OVER (PARTITION BY job_id, trace_id ORDER BY written_ns DESC) AS rn FROM report_rows
) WHERE rn = 1;

-- name: outcomes
-- Each trace's latest outcome under each verifier (`attribute` and `watch` write outcome_rows).
CREATE OR REPLACE TEMP VIEW outcomes AS
SELECT * EXCLUDE (rn) FROM (
    SELECT *, row_number() OVER (PARTITION BY trace_id, verifier ORDER BY scored_ns DESC) AS rn FROM outcome_rows
) WHERE rn = 1;
