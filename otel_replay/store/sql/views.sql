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
-- One row per step. Two spans for one model call (an SDK's own span under an instrumentation's
-- span) collapse to one step: the one with payloads, else the outer one. step_index numbers the
-- intervention targets (every kind but agent) by start time, from 0.
CREATE OR REPLACE TEMP VIEW steps AS
WITH latest AS (
    SELECT * EXCLUDE (rn) FROM (
        SELECT *, row_number() OVER (PARTITION BY trace_id, span_id ORDER BY ingested_ns DESC) AS rn
        FROM step_rows
    ) WHERE rn = 1
),
grouped AS (
    SELECT s.*,
           CASE WHEN s.kind = 'llm' AND p.kind = 'llm' THEN p.span_id ELSE s.span_id END AS call_span_id
    FROM latest s
    LEFT JOIN latest p ON p.trace_id = s.trace_id AND p.span_id = s.parent_span_id
),
collapsed AS (
    SELECT * EXCLUDE (rn) FROM (
        SELECT *, row_number() OVER (
            PARTITION BY trace_id, call_span_id
            ORDER BY has_payload DESC, (span_id = call_span_id) DESC
        ) AS rn
        FROM grouped
    ) WHERE rn = 1
)
SELECT * EXCLUDE (call_span_id),
       (NOT has_payload AND kind <> 'agent') AS observation_only,
       CASE WHEN kind <> 'agent' THEN
           row_number() OVER (PARTITION BY trace_id, kind = 'agent' ORDER BY start_ns, span_id) - 1
       END AS step_index,
       (end_ns - start_ns) / 1e6 AS duration_ms
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
