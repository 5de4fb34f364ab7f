-- Named queries the library runs. Values are always bound (?), never pasted in.

-- name: list_traces
SELECT trace_id, start, root_name, service_name, steps, llm_steps, tool_steps, status, tokens, duration_ms
FROM traces
WHERE (NOT ? OR status = 'error')
  AND start_ns >= ?
ORDER BY start_ns DESC
LIMIT ?;

-- name: trace_exists
SELECT count(*) FROM spans WHERE trace_id = ?;

-- name: trace_ids_with_prefix
SELECT DISTINCT trace_id FROM spans WHERE starts_with(trace_id, ?) LIMIT 5;

-- name: trajectory_steps
SELECT * FROM steps WHERE trace_id = ? ORDER BY start_ns, span_id;

-- name: trajectory_trace
SELECT * FROM traces WHERE trace_id = ?;

-- name: messages_by_hash
-- list_contains of a bound list reaches the Parquet scan as a filter (row groups pruned by their
-- hash ranges); `IN (SELECT unnest(?))` and `= ANY(?)` became a join over every message (13 s
-- instead of 50 ms for one trajectory in a store of 10^7 spans, `otel-replay bench scale`).
SELECT hash, body FROM messages WHERE list_contains(?::VARCHAR[], hash);

-- name: capture_totals
SELECT coalesce(sum(accepted), 0), coalesce(sum(dropped_queue_full), 0), coalesce(sum(skipped), 0)
FROM capture_health;

-- name: table_counts
SELECT
    (SELECT count(*) FROM spans) AS spans,
    (SELECT count(*) FROM steps) AS steps,
    (SELECT count(*) FROM messages) AS messages,
    (SELECT count(*) FROM traces) AS traces;

-- name: trace_span_parents
SELECT span_id, parent_span_id FROM spans WHERE trace_id = ?;

-- name: compact_spans
-- Input: view `segment_input` over one day's span_rows segments. Newest copy of each span, by trace.
SELECT * EXCLUDE (rn) FROM (
    SELECT *, row_number() OVER (PARTITION BY trace_id, span_id ORDER BY ingested_ns DESC) AS rn
    FROM segment_input
) WHERE rn = 1
ORDER BY trace_id, start_ns, span_id;

-- name: compact_steps
SELECT * EXCLUDE (rn) FROM (
    SELECT *, row_number() OVER (PARTITION BY trace_id, span_id ORDER BY ingested_ns DESC) AS rn
    FROM segment_input
) WHERE rn = 1
ORDER BY trace_id, start_ns, span_id;

-- name: compact_messages
SELECT hash, any_value(kind) AS kind, any_value(role) AS role, any_value(body) AS body
FROM segment_input
GROUP BY hash
ORDER BY hash;

-- name: compact_stats
SELECT * FROM segment_input ORDER BY written_ns;

-- name: capture_health_rows
SELECT host, pid, written_ns, accepted, dropped_queue_full, skipped, skip_reasons FROM capture_health ORDER BY host, pid;

-- name: existing_span_ids
SELECT DISTINCT trace_id, span_id FROM span_rows WHERE trace_id IN (SELECT unnest(?::VARCHAR[]));

-- name: job_rollouts
SELECT * FROM rollouts WHERE job_id = ?;

-- name: job_state
SELECT * FROM jobs WHERE job_id = ?;

-- name: list_jobs
SELECT job_id, make_timestamp(created_ns // 1000) AS created, status, traces, traces_done, rollouts_done,
       policy_calls, message
FROM jobs ORDER BY created_ns DESC LIMIT ?;

-- name: job_results
SELECT * FROM results WHERE job_id = ? AND trace_id = ? ORDER BY method, step_index;

-- name: aggregate_by_step_name
-- The systematic weak step across failing runs: how often each step name is the culprit.
SELECT name, kind,
       count(DISTINCT trace_id) AS traces,
       count(*) FILTER (WHERE culprit) AS culprit_in,
       round(100.0 * count(*) FILTER (WHERE culprit) / count(DISTINCT trace_id), 1) AS culprit_pct,
       count(*) FILTER (WHERE verdict = 'undecided') AS undecided_in,
       round(avg(estimate), 3) AS mean_effect,
       round(max(estimate), 3) AS max_effect
FROM results
WHERE method = 'contrastive' AND (? IS NULL OR job_id = ?)
  AND (? IS NULL OR trace_id IN (SELECT unnest(?::VARCHAR[])))
GROUP BY name, kind
ORDER BY culprit_in DESC, mean_effect DESC NULLS LAST;

-- name: job_report
SELECT report FROM reports WHERE job_id = ? AND trace_id = ?;

-- name: job_reports
SELECT trace_id, report FROM reports WHERE job_id = ? ORDER BY trace_id;

-- name: trace_root_span
SELECT root_span_id FROM traces WHERE trace_id = ?;

-- name: trace_span_rows
SELECT trace_id, span_id, parent_span_id, name, span_kind, start_ns, end_ns, status_code, status_message,
       service_name, scope_name, scope_version, attributes, events, links, resource
FROM spans WHERE trace_id = ? ORDER BY start_ns, span_id;

-- name: compact_rows
-- Input: view `segment_input` over one day's segments of a job table; every row kept (the views dedupe).
SELECT * FROM segment_input;
