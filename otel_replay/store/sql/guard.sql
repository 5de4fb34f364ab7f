-- The user's SQL (`otel-replay sql`, `--where`) runs on a connection locked down to the store.

-- name: allow_paths
-- the segments behind the views, and nothing else (neither the store's other files nor its directories)
SET allowed_paths = ?;

-- name: disable_external_access
-- no other file, URL, ATTACH, INSTALL or LOAD
SET enable_external_access = false;

-- name: lock_configuration
-- the user's SQL cannot SET or RESET its way back out
SET lock_configuration = true;

-- name: serialize_select
-- a SELECT's parse tree as JSON (parsed, never run): checks a --where predicate's shape
SELECT json_serialize_sql(?::VARCHAR);
