-- otel-replay store: the Parquet segment schemas. This file is the single declaration of every
-- stored table and column; otel_replay.store.schema reads the Arrow schemas from it and
-- tests/test_schema.py checks that DuckDB reads it alike. `day` is the hive partition column
-- (directory day=YYYY-MM-DD) and is not stored inside the files.

-- One row per captured span (GenAI spans and the ancestors a trajectory needs). Payload
-- attributes are not repeated here: they live in `messages`, addressed from `step_rows`.
CREATE TABLE span_rows (
    trace_id          VARCHAR NOT NULL,  -- 32 lowercase hex
    span_id           VARCHAR NOT NULL,  -- 16 lowercase hex
    parent_span_id    VARCHAR,
    name              VARCHAR NOT NULL,
    span_kind         VARCHAR,           -- INTERNAL, CLIENT, SERVER, PRODUCER, CONSUMER
    start_ns          BIGINT,
    end_ns            BIGINT,
    status_code       VARCHAR,           -- unset, ok, error
    status_message    VARCHAR,
    service_name      VARCHAR,
    scope_name        VARCHAR,
    scope_version     VARCHAR,
    attributes        VARCHAR,           -- JSON object, payload attributes removed
    events            VARCHAR,           -- JSON array of {name, time_ns, attributes}
    links             VARCHAR,           -- JSON array of {trace_id, span_id, attributes}
    resource          VARCHAR,           -- JSON object of resource attributes
    source            VARCHAR NOT NULL,  -- capture, import:<format>, collect
    ingested_ns       BIGINT NOT NULL
);

-- One row per step: the canonical, convention-independent view of a GenAI operation.
CREATE TABLE step_rows (
    trace_id          VARCHAR NOT NULL,
    span_id           VARCHAR NOT NULL,
    parent_span_id    VARCHAR,
    kind              VARCHAR NOT NULL,  -- llm, tool, retrieval, embedding, agent
    operation         VARCHAR,           -- chat, text_completion, execute_tool, invoke_agent, ...
    name              VARCHAR NOT NULL,  -- tool name, agent name, or "<operation> <model>"
    start_ns          BIGINT,
    end_ns            BIGINT,
    status            VARCHAR NOT NULL,  -- unset, ok, error
    error_type        VARCHAR,
    error_message     VARCHAR,
    provider          VARCHAR,
    request_model     VARCHAR,
    response_model    VARCHAR,
    input_tokens      BIGINT,
    output_tokens     BIGINT,
    agent_name        VARCHAR,
    conversation_id   VARCHAR,
    tool_name         VARCHAR,
    tool_call_id      VARCHAR,
    system_hash       VARCHAR,           -- messages.hash of the system instructions
    tools_hash        VARCHAR,           -- messages.hash of the tool definitions
    input_hashes      VARCHAR[],         -- messages.hash of each input message, in order
    output_hashes     VARCHAR[],         -- messages.hash of each output message, in order
    request_params    VARCHAR,           -- JSON object: temperature, max_tokens, seed, ...
    finish_reasons    VARCHAR[],
    has_payload       BOOLEAN NOT NULL,  -- false: observation-only (content was not captured)
    redacted          VARCHAR[],         -- '<part>:<rule>' per redaction, e.g. input:email (NULL in rows of older versions)
    convention        VARCHAR NOT NULL,  -- the adapter that produced the row
    service_name      VARCHAR,
    source            VARCHAR NOT NULL,
    ingested_ns       BIGINT NOT NULL
);

-- Content-addressed payloads: each message (or system instructions, or tool definitions)
-- stored once; `hash` is xxh3-128 of exactly the bytes in `body`.
CREATE TABLE message_rows (
    hash              VARCHAR NOT NULL,
    kind              VARCHAR NOT NULL,  -- message, system, tools
    role              VARCHAR,
    body              VARCHAR NOT NULL   -- canonical JSON
);

-- Counters the capture pipeline reports (drops, skipped records) so `otel-replay` can show them.
CREATE TABLE capture_stats (
    pid               BIGINT NOT NULL,
    host              VARCHAR,
    written_ns        BIGINT NOT NULL,
    accepted          BIGINT NOT NULL,
    dropped_queue_full BIGINT NOT NULL,
    skipped           BIGINT NOT NULL,
    skip_reasons      VARCHAR            -- JSON object reason -> count
);

-- Attribution jobs: one row per state change of a job (the newest row is the job's state).
CREATE TABLE job_rows (
    job_id            VARCHAR NOT NULL,
    created_ns        BIGINT NOT NULL,
    updated_ns        BIGINT NOT NULL,
    status            VARCHAR NOT NULL,  -- running, done, partial (the budget ran out), failed
    params            VARCHAR NOT NULL,  -- JSON: traces, verifier, method, rollouts, seed, ...
    traces            BIGINT NOT NULL,
    traces_done       BIGINT NOT NULL,
    rollouts_done     BIGINT NOT NULL,
    policy_calls      BIGINT NOT NULL,
    message           VARCHAR
);

-- One row per rollout: a pure function of (trace, plan, seed), so a resumed job skips those it has.
CREATE TABLE rollout_rows (
    job_id            VARCHAR NOT NULL,
    trace_id          VARCHAR NOT NULL,
    plan              VARCHAR NOT NULL,  -- ReplayPlan.key()
    step_index        BIGINT,            -- the step the plan is about (NULL: factual)
    role              VARCHAR NOT NULL,  -- held, resampled, factual, repair, shapley
    rollout           BIGINT NOT NULL,   -- index within (job, trace, plan)
    seed              BIGINT NOT NULL,
    score             DOUBLE,            -- verifier score in [0, 1]; NULL when unreplayable or errored
    failed            BOOLEAN,           -- score below the threshold; NULL when not scored (excluded from estimates)
    unreplayable      BOOLEAN NOT NULL,  -- cannot be replayed: no policy, or content not captured
    errored           BOOLEAN,           -- a policy raised, broke its contract or timed out (NULL in rows of older versions)
    reason            VARCHAR,
    policy_calls      BIGINT NOT NULL,
    tokens            BIGINT,            -- tokens the policies reported (NULL: none reported)
    diverged_at       BIGINT,
    duration_ms       DOUBLE NOT NULL,
    final_output      VARCHAR,
    digest            VARCHAR NOT NULL,
    detail            VARCHAR            -- JSON: e.g. the culprit step's output in this rollout
);

-- Attribution results: one row per (job, trace, step).
CREATE TABLE result_rows (
    job_id            VARCHAR NOT NULL,
    trace_id          VARCHAR NOT NULL,
    step_index        BIGINT NOT NULL,
    span_id           VARCHAR NOT NULL,
    name              VARCHAR NOT NULL,
    kind              VARCHAR NOT NULL,
    agent_name        VARCHAR,
    method            VARCHAR NOT NULL,  -- contrastive, shapley
    estimate          DOUBLE,
    ci_low            DOUBLE,
    ci_high           DOUBLE,
    fail_held         DOUBLE,            -- P(fail | steps <= i held)
    fail_resampled    DOUBLE,            -- P(fail | steps < i held, i re-decided)
    n_held            BIGINT,
    n_resampled       BIGINT,
    verdict           VARCHAR NOT NULL,  -- decisive, contributing, locked-in, no effect, protective, undecided, observation-only, no policy, unreplayable, not scored
    culprit           BOOLEAN NOT NULL,
    rank              BIGINT
);

-- The full attribution report of each (job, trace), for `otel-replay report` to re-render.
CREATE TABLE report_rows (
    job_id            VARCHAR NOT NULL,
    trace_id          VARCHAR NOT NULL,
    written_ns        BIGINT NOT NULL,
    report            VARCHAR NOT NULL   -- JSON, schemas/attribution-report.schema.json
);

-- What a verifier said of a recorded run: `attribute` scores the run before replaying it, `watch`
-- scores new traces to find the failures. The `outcomes` view keeps the latest per trace and verifier.
CREATE TABLE outcome_rows (
    trace_id          VARCHAR NOT NULL,
    verifier          VARCHAR NOT NULL,  -- its spec (contains:TEXT, regex:RE, pkg.mod:fn, ...) or a callable's module:name
    score             DOUBLE,            -- in [0, 1]; NULL when the run could not be scored (see reason)
    threshold         DOUBLE NOT NULL,
    passed            BOOLEAN,           -- score >= threshold; NULL when not scored
    signature         VARCHAR,           -- JSON [root name, failing step name, final-output hash]: identical failures share it
    source            VARCHAR NOT NULL,  -- attribute, watch
    job_id            VARCHAR,           -- the job that scored it (NULL: a watcher's check)
    reason            VARCHAR,           -- why the run was not scored
    scored_ns         BIGINT NOT NULL
);

-- Traces a job skipped, and why: a batch job's trace that passes the verifier or cannot be replayed.
CREATE TABLE skip_rows (
    job_id            VARCHAR NOT NULL,
    trace_id          VARCHAR NOT NULL,
    reason            VARCHAR NOT NULL,
    skipped_ns        BIGINT NOT NULL
);

-- `watch` groups identical failures (one outcome signature): one representative per group and
-- interval is attributed; the group's other traces link to its result.
CREATE TABLE group_links (
    trace_id          VARCHAR NOT NULL,
    representative    VARCHAR NOT NULL,  -- the trace attributed for the group (the trace itself on its own row)
    job_id            VARCHAR NOT NULL,  -- the representative's job: its results and report
    signature         VARCHAR NOT NULL,
    role              VARCHAR NOT NULL,  -- representative, member
    linked_ns         BIGINT NOT NULL
);

-- The policy-call ledger of `watch --max-policy-calls-per-hour`: a row when a job is granted calls,
-- another when it stops; the latest row of a grant wins.
CREATE TABLE budget_rows (
    ledger            VARCHAR NOT NULL,
    grant_id          VARCHAR NOT NULL,
    job_id            VARCHAR NOT NULL,
    granted           BIGINT NOT NULL,
    spent             BIGINT,            -- NULL while the job runs (its grant then counts in full)
    granted_ns        BIGINT NOT NULL,
    ended_ns          BIGINT,            -- NULL while the job runs
    written_ns        BIGINT NOT NULL
);
