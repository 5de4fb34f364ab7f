-- Queries the benchmarks time (`otel-replay bench scale`). Values are always bound, never pasted in.

-- name: step_name_aggregate
-- Every step name across the store: calls, errors, latency and tokens (a dashboard's "which step is slow or failing").
SELECT name, kind,
       count(*) AS calls,
       count(*) FILTER (WHERE status = 'error') AS errors,
       round(avg(duration_ms), 1) AS mean_ms,
       round(quantile_cont(duration_ms, 0.95), 1) AS p95_ms,
       sum(input_tokens)::BIGINT AS input_tokens,
       sum(output_tokens)::BIGINT AS output_tokens
FROM steps
WHERE kind <> 'agent'
GROUP BY name, kind
ORDER BY calls DESC;
