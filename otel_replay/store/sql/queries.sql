-- Named queries the library runs. Values are always bound (?), never pasted in.

-- name: list_traces
-- status: 'error' (the root span or the last step failed), 'failed' (a verifier's latest outcome is
-- below its threshold: `attribute` and `watch` score runs), 'error, failed' (both), else 'ok'.
WITH verdicts AS (
    SELECT trace_id, bool_or(NOT passed) AS failed FROM outcomes GROUP BY trace_id
)
SELECT t.trace_id, t.start, t.root_name, t.service_name, t.steps, t.llm_steps, t.tool_steps,
       CASE WHEN t.status = 'error' AND v.failed THEN 'error, failed'
            WHEN v.failed THEN 'failed'
            ELSE t.status END AS status,
       t.tokens, t.duration_ms
FROM traces t LEFT JOIN verdicts v USING (trace_id)
WHERE (NOT ? OR t.status = 'error' OR coalesce(v.failed, false))
  AND t.start_ns >= ?
ORDER BY t.start_ns DESC
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

-- name: outcome_counts
-- What verifiers said: traces scored, failed (latest outcome below the threshold under some
-- verifier), unscored (a verifier raised), and traces whose spans say error.
SELECT
    (SELECT count(DISTINCT trace_id) FROM outcomes) AS scored,
    (SELECT count(DISTINCT trace_id) FROM outcomes WHERE NOT passed) AS failed,
    (SELECT count(DISTINCT trace_id) FROM outcomes WHERE passed IS NULL) AS unscored,
    (SELECT count(*) FROM traces WHERE status = 'error') AS errors;

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
-- skipped: traces the job skipped (`otel-replay jobs --skipped` lists them with the reason).
SELECT job_id, make_timestamp(created_ns // 1000) AS created, status, traces, traces_done,
       (SELECT count(DISTINCT s.trace_id) FROM skip_rows s WHERE s.job_id = jobs.job_id) AS skipped,
       rollouts_done, policy_calls, message
FROM jobs ORDER BY created_ns DESC LIMIT ?;

-- name: list_skipped
-- Traces jobs skipped, newest first: job (NULL: every job), limit. Job `watch`: failures a
-- watcher's hourly budget keeps waiting, until they have a report or a group link.
SELECT job_id, trace_id, arg_min(reason, skipped_ns) AS reason,
       make_timestamp(min(skipped_ns) // 1000) AS skipped
FROM skip_rows
WHERE (? IS NULL OR job_id = ?)
  AND (job_id <> 'watch' OR (trace_id NOT IN (SELECT trace_id FROM reports)
                             AND trace_id NOT IN (SELECT trace_id FROM group_links)))
GROUP BY job_id, trace_id
ORDER BY min(skipped_ns) DESC, trace_id
LIMIT ?;

-- name: job_skips
SELECT trace_id, arg_min(reason, skipped_ns) AS reason FROM skip_rows WHERE job_id = ? GROUP BY trace_id;

-- name: job_results
SELECT * FROM results WHERE job_id = ? AND trace_id = ? ORDER BY method, step_index;

-- name: aggregate_by_step_name
-- The systematic weak step across failing runs: how often each step name is the culprit. A trace
-- attributed by several jobs counts once: its latest job (by creation time) wins.
-- Params: job (NULL: every job) twice, trace ids (NULL: every trace) twice.
WITH latest AS (
    SELECT trace_id, first(job_id ORDER BY created_ns DESC, job_id DESC) AS job_id
    FROM (
        SELECT DISTINCT r.trace_id, r.job_id, j.created_ns
        FROM results r JOIN jobs j USING (job_id)
        WHERE r.method = 'contrastive' AND (? IS NULL OR r.job_id = ?)
    )
    GROUP BY trace_id
)
SELECT name, kind,
       count(DISTINCT trace_id) AS traces,
       count(*) FILTER (WHERE culprit) AS culprit_in,
       round(100.0 * count(*) FILTER (WHERE culprit) / count(DISTINCT trace_id), 1) AS culprit_pct,
       count(*) FILTER (WHERE verdict = 'undecided') AS undecided_in,
       round(avg(estimate), 3) AS mean_effect,
       round(max(estimate), 3) AS max_effect
FROM results JOIN latest USING (trace_id, job_id)
WHERE method = 'contrastive'
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

-- name: job_spent
-- Policy calls a job has spent: its rollouts' calls, or its last state's count when higher (that one
-- also counts calls of rollouts a budget cut short).
SELECT greatest(
    (SELECT coalesce(sum(policy_calls), 0) FROM rollouts WHERE job_id = ?),
    (SELECT coalesce(max(policy_calls), 0) FROM jobs WHERE job_id = ?))::BIGINT;

-- name: watch_unscored
-- Input: {where}, the watcher's predicate over the traces view (checked to be one SQL expression).
-- Traces matching it that ended before ? (settled: no span still on its way) and that the verifier
-- ? has not scored, oldest first, at most ?.
SELECT trace_id FROM traces
WHERE ({where})
  AND start_ns + coalesce(duration_ms, 0) * 1e6 <= ?
  AND trace_id NOT IN (SELECT trace_id FROM outcomes WHERE verifier = ?)
ORDER BY start_ns, trace_id
LIMIT ?;

-- name: watch_pending
-- Failures a watcher has to handle: traces whose latest outcome under the verifier is below the
-- threshold, with no report from any job, no group link, and no finished watch job. A watch job's
-- id is 'w' and the first 12 hex digits of md5('<watch fingerprint>:<trace id>'), so every watcher
-- of one configuration names the same job for a trace. Unfinished watch jobs first (they resume),
-- then the oldest outcomes. Params: fingerprint, verifier, threshold, signature (NULL: any) twice, limit.
WITH pending AS (
    SELECT o.trace_id, o.signature, o.scored_ns, 'w' || left(md5(? || ':' || o.trace_id), 12) AS job_id
    FROM outcomes o
    WHERE o.verifier = ? AND o.score < ? AND o.signature IS NOT NULL
      AND (? IS NULL OR o.signature = ?)
      AND NOT EXISTS (SELECT 1 FROM reports r WHERE r.trace_id = o.trace_id)
      AND NOT EXISTS (SELECT 1 FROM group_links l WHERE l.trace_id = o.trace_id)
)
SELECT p.trace_id, p.signature, p.job_id, j.status
FROM pending p LEFT JOIN jobs j USING (job_id)
WHERE j.status IS NULL OR j.status NOT IN ('done', 'partial', 'failed')
ORDER BY j.status IS NULL, p.scored_ns, p.trace_id
LIMIT ?;

-- name: group_representative
-- The group's newest representative attributed at or after ? (the current interval's start).
SELECT representative, job_id FROM group_links
WHERE signature = ? AND role = 'representative' AND linked_ns >= ?
ORDER BY linked_ns DESC, representative
LIMIT 1;

-- name: trace_links
-- The group links of some traces (a representative's own row included).
SELECT trace_id, representative, job_id, signature, role FROM group_links
WHERE list_contains(?::VARCHAR[], trace_id)
ORDER BY trace_id, linked_ns;

-- name: ledger_counted
-- What a policy-call ledger counts at a moment: every grant whose job ended after the given time
-- (an hour before) or has not ended, with its spent calls (its whole grant while it runs); and the
-- earliest end among them (the budget frees an hour after it). Params: ledger, since.
SELECT coalesce(sum(coalesce(spent, granted)), 0)::BIGINT AS counted, min(ended_ns) AS first_ended_ns
FROM (
    SELECT * EXCLUDE (rn) FROM (
        SELECT *, row_number() OVER (PARTITION BY grant_id ORDER BY ended_ns IS NOT NULL DESC, written_ns DESC) AS rn
        FROM budget_rows WHERE ledger = ?
    ) WHERE rn = 1
)
WHERE ended_ns IS NULL OR ended_ns > ?;

-- name: ledger_open_grants
-- A job's grants that never ended (the process running it died). Params: ledger, job.
SELECT grant_id, job_id, granted, granted_ns FROM (
    SELECT *, row_number() OVER (PARTITION BY grant_id ORDER BY ended_ns IS NOT NULL DESC, written_ns DESC) AS rn
    FROM budget_rows WHERE ledger = ? AND job_id = ?
) WHERE rn = 1 AND ended_ns IS NULL;
