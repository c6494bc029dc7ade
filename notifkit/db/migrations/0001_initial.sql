-- 0001_initial: the complete notifkit data model (CONTRACT §7).
--
-- Conventions every query can rely on:
--
-- * Names are unqualified. The migration runner and every pool set search_path to DB_SCHEMA,
--   so the same file builds the model in `public` or in any other schema.
-- * Tenancy: every tenant table has a NOT NULL project_id, and project_id is the first column
--   of every composite key and index, so each query starts "WHERE project_id = $1 AND ...".
--   Globally unique ids (event, task, instance: UUIDv7 made by the services) are the only
--   lookups without project_id in front; queries still add "AND project_id = $n".
-- * Ids the caller chooses (users, templates, workflows) are text; ids notifkit generates are
--   uuid (event, instance, contact, key, in-app message) or text where the id is built by a
--   service and only ever echoed (task ids). Every uuid key defaults to gen_random_uuid(), so a
--   writer may pass its own UUIDv7 or let PostgreSQL pick one.
-- * Times are timestamptz. Writers set updated_at = now() themselves in their UPDATE/UPSERT.
-- * JSON is jsonb. Pools from notifkit.db.pool decode it to Python objects and encode Python
--   objects (pass dicts and lists, never pre-serialised strings).
-- * CHECK constraints pin only the value sets the HTTP API defines (channels, roles,
--   priorities, recipient statuses). Internal states (workflow status, outbox status, log kind)
--   are documented in comments and left open so a service can add one without a migration.
-- * Foreign keys with ON DELETE CASCADE tie configuration and state to their project and user.
--   The append-only ledgers written in batches on hot paths (message_logs, ai_usage) carry
--   project_id without a foreign key, so one row about a vanished project can never fail a batch.

-- ---------------------------------------------------------------------------------------------
-- Tenants and their API keys

CREATE TABLE projects (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text        NOT NULL,
    settings    jsonb       NOT NULL DEFAULT '{}'
                            CHECK (jsonb_typeof(settings) = 'object'),
    created_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE projects IS 'Tenants. Every other table hangs off a project.';
COMMENT ON COLUMN projects.settings IS
    'Per-project overrides, as the API shows them: {"throttle": {"limit", "windowSeconds"}, '
    '"rateLimits": {"email", "sms", "push"}} (per-provider sends per second). Absent = defaults.';

CREATE TABLE project_api_keys (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id  uuid        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    key_hash    text        NOT NULL UNIQUE CHECK (key_hash ~ '^[0-9a-f]{64}$'),
    role        text        NOT NULL CHECK (role IN ('full', 'send')),
    name        text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
COMMENT ON TABLE project_api_keys IS
    'API keys, stored only as the lower-case hex SHA-256 of the key. Authentication looks a key '
    'up by key_hash alone (it is what tells us the project); a key with revoked_at set is dead.';
CREATE INDEX project_api_keys_project_idx ON project_api_keys (project_id, created_at);

-- ---------------------------------------------------------------------------------------------
-- Users, their addresses, segments and preferences

CREATE TABLE users (
    project_id  uuid        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    id          text        NOT NULL,
    attributes  jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(attributes) = 'object'),
    timezone    text,
    locale      text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, id)
);
COMMENT ON TABLE users IS
    'Recipients, keyed by the caller''s external id. Deleting a user cascades to contacts, '
    'segments, preferences and quiet hours.';
COMMENT ON COLUMN users.timezone IS 'IANA zone (e.g. Europe/Berlin); NULL means UTC.';

CREATE TABLE user_contacts (
    id               uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id       uuid        NOT NULL,
    user_id          text        NOT NULL,
    channel          text        NOT NULL CHECK (channel IN ('email', 'sms', 'push', 'webhook')),
    target           text        NOT NULL,
    enabled          boolean     NOT NULL DEFAULT true,
    disabled_reason  text,
    disabled_at      timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, user_id, channel, target),
    FOREIGN KEY (project_id, user_id) REFERENCES users (project_id, id) ON DELETE CASCADE
);
COMMENT ON TABLE user_contacts IS
    'Addresses: e-mail address, E.164 number, device token or https URL. Delivery sets '
    'enabled = false (with disabled_reason, e.g. invalid_token) when a provider rejects the '
    'address; such a contact is never sent to again. Contacts of a user come from the unique '
    'index (project_id, user_id, ...).';
-- Delivery disables an address by (project, channel, target), whichever users share it.
CREATE INDEX user_contacts_target_idx ON user_contacts (project_id, channel, target);

CREATE TABLE user_segments (
    project_id  uuid NOT NULL,
    user_id     text NOT NULL,
    segment     text NOT NULL,
    PRIMARY KEY (project_id, segment, user_id),
    FOREIGN KEY (project_id, user_id) REFERENCES users (project_id, id) ON DELETE CASCADE
);
COMMENT ON TABLE user_segments IS
    'Segment membership. The primary key streams one segment in user-id order, so the enricher '
    'pages a segment with keyset pagination: WHERE project_id = $1 AND segment = $2 AND '
    'user_id > $last ORDER BY user_id LIMIT n.';
CREATE INDEX user_segments_user_idx ON user_segments (project_id, user_id);

CREATE TABLE user_channel_preferences (
    project_id  uuid    NOT NULL,
    user_id     text    NOT NULL,
    channel     text    NOT NULL
                        CHECK (channel IN ('email', 'sms', 'push', 'inapp', 'webhook')),
    enabled     boolean NOT NULL,
    PRIMARY KEY (project_id, user_id, channel),
    FOREIGN KEY (project_id, user_id) REFERENCES users (project_id, id) ON DELETE CASCADE
);
COMMENT ON TABLE user_channel_preferences IS
    'Explicit per-channel choices. No row = the channel is allowed.';

CREATE TABLE user_topic_preferences (
    project_id  uuid    NOT NULL,
    user_id     text    NOT NULL,
    topic       text    NOT NULL,
    enabled     boolean NOT NULL,
    PRIMARY KEY (project_id, user_id, topic),
    FOREIGN KEY (project_id, user_id) REFERENCES users (project_id, id) ON DELETE CASCADE
);
COMMENT ON TABLE user_topic_preferences IS
    'Explicit per-topic choices (a template''s topic). No row = the topic is allowed.';

CREATE TABLE quiet_hours (
    project_id  uuid NOT NULL,
    user_id     text NOT NULL,
    start_time  time NOT NULL,
    end_time    time NOT NULL,
    PRIMARY KEY (project_id, user_id),
    FOREIGN KEY (project_id, user_id) REFERENCES users (project_id, id) ON DELETE CASCADE
);
COMMENT ON TABLE quiet_hours IS
    'Daily quiet period in the user''s timezone (users.timezone). end_time < start_time means '
    'the period wraps midnight (22:00 to 07:00). No row = no quiet hours.';

-- ---------------------------------------------------------------------------------------------
-- Templates

CREATE TABLE templates (
    project_id  uuid        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    id          text        NOT NULL,
    topic       text,
    content     jsonb       NOT NULL CHECK (jsonb_typeof(content) = 'object'),
    fallback    jsonb       CHECK (jsonb_typeof(fallback) = 'array'),
    ai          jsonb       CHECK (jsonb_typeof(ai) = 'object'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, id)
);
COMMENT ON COLUMN templates.content IS
    'The API''s "channels" object: {"email": {"subject", "html", "text"}, "sms": {"text"}, ...}.';
COMMENT ON COLUMN templates.fallback IS 'Ordered channel list, e.g. ["push", "sms", "email"].';
COMMENT ON COLUMN templates.ai IS '{"model", "prompt", "channels"} for AI-written content.';

-- ---------------------------------------------------------------------------------------------
-- Sends and their timeline

CREATE TABLE notifications (
    id               uuid        PRIMARY KEY,
    project_id       uuid        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    template_id      text        NOT NULL,
    priority         text        NOT NULL DEFAULT 'normal'
                                 CHECK (priority IN ('critical', 'normal', 'low')),
    status           text        NOT NULL DEFAULT 'accepted',
    recipients_spec  jsonb       NOT NULL,
    data             jsonb       NOT NULL DEFAULT '{}',
    channels         jsonb       CHECK (jsonb_typeof(channels) = 'array'),
    send_at          timestamptz,
    campaign_id      text,
    idempotency_key  text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE notifications IS
    'One row per accepted POST /v1/notifications; id is the eventId (UUIDv7). status is the '
    'summary of the whole send; each recipient''s status and timeline come from message_logs.';
COMMENT ON COLUMN notifications.recipients_spec IS
    'The request''s "to" as given: "user-1", ["user-1", ...] or {"segment": "beta"}.';
COMMENT ON COLUMN notifications.channels IS 'Requested channels; NULL = the template''s channels.';
CREATE INDEX notifications_project_created_idx ON notifications (project_id, created_at DESC, id);

CREATE TABLE message_logs (
    id                   bigint      GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    project_id           uuid        NOT NULL,
    event_id             uuid        NOT NULL,
    task_id              text        NOT NULL,
    user_id              text,
    channel              text        NOT NULL
                         CHECK (channel IN ('', 'email', 'sms', 'push', 'inapp', 'webhook')),
    attempt              integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    kind                 text        NOT NULL,
    status               text        NOT NULL CHECK (status IN (
                             'accepted', 'processing', 'scheduled', 'sent', 'delivered', 'failed',
                             'skipped', 'suppressed', 'throttled', 'dead_lettered')),
    detail               text,
    provider             text,
    provider_message_id  text,
    campaign_id          text,
    metadata             jsonb       NOT NULL DEFAULT '{}',
    created_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (task_id, channel, attempt, kind)
);
COMMENT ON TABLE message_logs IS
    'Append-only timeline of every decision, attempt and provider event. Writers insert with '
    'ON CONFLICT (task_id, channel, attempt, kind) DO NOTHING, so a replayed stream entry or a '
    'repeated webhook records nothing twice. A row about the whole event rather than one '
    'recipient+channel (e.g. accepted) uses task_id = the event id and channel = ''''.';
COMMENT ON COLUMN message_logs.kind IS
    'What happened: accepted, processing, skipped, suppressed, throttled, deferred, scheduled, '
    'sent, delivered, bounced, complained, opened, clicked, failed, dead_lettered, ...';
COMMENT ON COLUMN message_logs.status IS
    'The recipient status this row implies (the API''s status values); the latest row of a '
    'task+channel is its current status.';
COMMENT ON COLUMN message_logs.metadata IS
    'Provider detail: clicked URL, error code, Retry-After, AI tokens, ...';
-- GET /v1/notifications/{eventId}: the timeline of one send.
CREATE INDEX message_logs_event_idx ON message_logs (project_id, event_id, created_at, id);
-- GET /v1/messages, unfiltered or by status/channel, newest first with a (created_at, id) cursor.
CREATE INDEX message_logs_project_created_idx ON message_logs (project_id, created_at DESC, id DESC);
-- GET /v1/messages?userId=
CREATE INDEX message_logs_user_idx ON message_logs (project_id, user_id, created_at DESC, id DESC);
-- GET /v1/messages?campaignId= and campaign reporting.
CREATE INDEX message_logs_campaign_idx ON message_logs (project_id, campaign_id, created_at DESC)
    WHERE campaign_id IS NOT NULL;
-- Provider webhooks name the provider's message id (the project comes from the webhook URL).
CREATE INDEX message_logs_provider_message_idx ON message_logs (project_id, provider_message_id)
    WHERE provider_message_id IS NOT NULL;

CREATE TABLE suppressions (
    project_id  uuid        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    channel     text        NOT NULL CHECK (channel IN ('email', 'sms', 'push', 'webhook')),
    target      text        NOT NULL,
    reason      text        NOT NULL,
    detail      text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, channel, target)
);
COMMENT ON TABLE suppressions IS
    'Addresses never to contact again in this project. reason: bounce, complaint, unsubscribe, '
    'manual. Insert with ON CONFLICT DO NOTHING; the engine reads it before every dispatch.';

-- ---------------------------------------------------------------------------------------------
-- Delivery, scheduling and the in-app inbox

CREATE TABLE delivery_outbox (
    task_id              text        NOT NULL,
    channel              text        NOT NULL,
    destination          text        NOT NULL,
    project_id           uuid        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    provider             text        NOT NULL,
    provider_message_id  text,
    status               text        NOT NULL DEFAULT 'sending',
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, channel, destination)
);
COMMENT ON TABLE delivery_outbox IS
    'What delivery handed to a provider, keyed on (task, channel, destination). status: '
    'sending (claimed before the provider call), sent (provider accepted; provider_message_id '
    'set), failed. A retry that finds sent does not call the provider again.';
CREATE INDEX delivery_outbox_provider_message_idx
    ON delivery_outbox (project_id, provider, provider_message_id)
    WHERE provider_message_id IS NOT NULL;

CREATE TABLE scheduled_payloads (
    task_id     text        PRIMARY KEY,
    project_id  uuid        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    due_at      timestamptz NOT NULL,
    priority    text        NOT NULL DEFAULT 'normal'
                            CHECK (priority IN ('critical', 'normal', 'low')),
    stream      text        NOT NULL,
    payload     jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE scheduled_payloads IS
    'Tasks waiting for their time (sendAt, quiet hours, a provider''s Retry-After). The scheduler '
    'upserts the row before adding the task to its Redis shard and deletes it after moving the '
    'task to "stream"; the shards can be rebuilt from this table. stream is the key the task '
    'is added to when due.';
CREATE INDEX scheduled_payloads_due_idx ON scheduled_payloads (due_at);

CREATE TABLE inapp_messages (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id  uuid        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    user_id     text        NOT NULL,
    task_id     text        NOT NULL UNIQUE,
    event_id    uuid        NOT NULL,
    content     jsonb       NOT NULL,
    read_at     timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE inapp_messages IS
    'The in-app inbox. task_id is unique, so delivering the same task twice stores one message '
    '(INSERT ... ON CONFLICT (task_id) DO NOTHING). Not tied to users by a foreign key, so a '
    'delivery racing a user''s deletion cannot fail: DELETE /v1/users deletes these rows too.';
CREATE INDEX inapp_messages_user_idx ON inapp_messages (project_id, user_id, created_at DESC, id);
CREATE INDEX inapp_messages_unread_idx ON inapp_messages (project_id, user_id, created_at DESC, id)
    WHERE read_at IS NULL;

-- ---------------------------------------------------------------------------------------------
-- Workflows

CREATE TABLE workflow_definitions (
    project_id  uuid        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    id          text        NOT NULL,
    steps       jsonb       NOT NULL CHECK (jsonb_typeof(steps) = 'array'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, id)
);
COMMENT ON COLUMN workflow_definitions.steps IS 'The API''s "steps" array as given.';

CREATE TABLE workflow_instances (
    id               uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id       uuid        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    workflow_id      text        NOT NULL,
    user_id          text        NOT NULL,
    status           text        NOT NULL DEFAULT 'running',
    current_step     integer     NOT NULL DEFAULT 0,
    steps            jsonb       NOT NULL CHECK (jsonb_typeof(steps) = 'array'),
    trigger_data     jsonb       NOT NULL DEFAULT '{}',
    idempotency_key  text,
    wake_at          timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, idempotency_key)
);
COMMENT ON TABLE workflow_instances IS
    'One run of a workflow for one user; id is the instanceId (UUIDv7). status: running, '
    'waiting, completed, stopped, failed. A repeated trigger with the same idempotency key finds '
    'the existing row (INSERT ... ON CONFLICT (project_id, idempotency_key) DO NOTHING).';
COMMENT ON COLUMN workflow_instances.steps IS
    'The definition''s steps when the instance started: editing a workflow never changes an '
    'instance already running.';
COMMENT ON COLUMN workflow_instances.wake_at IS
    'When a sleeping instance (wait, waitForEvent timeout, digest window) is due; the Redis '
    'timer set can be rebuilt from it. NULL when not sleeping.';
CREATE INDEX workflow_instances_workflow_idx
    ON workflow_instances (project_id, workflow_id, created_at DESC);
CREATE INDEX workflow_instances_wake_idx ON workflow_instances (wake_at)
    WHERE wake_at IS NOT NULL;

CREATE TABLE workflow_steps (
    instance_id  uuid        NOT NULL REFERENCES workflow_instances (id) ON DELETE CASCADE,
    step_index   integer     NOT NULL,
    project_id   uuid        NOT NULL,
    type         text        NOT NULL,
    status       text        NOT NULL,
    output       jsonb,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    PRIMARY KEY (instance_id, step_index)
);
COMMENT ON TABLE workflow_steps IS
    'Step outputs, persisted as each step runs (API steps[].index = step_index). type: send, '
    'wait, waitForEvent, branch, digest. status: running, waiting, completed, skipped, failed. '
    'A waitForEvent step''s output is the event, or null after a timeout.';

CREATE TABLE workflow_waiters (
    id           uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id   uuid        NOT NULL,
    instance_id  uuid        NOT NULL REFERENCES workflow_instances (id) ON DELETE CASCADE,
    user_id      text        NOT NULL,
    event_name   text        NOT NULL,
    step_index   integer     NOT NULL,
    expires_at   timestamptz NOT NULL,
    resolved_at  timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (instance_id, step_index)
);
COMMENT ON TABLE workflow_waiters IS
    'Open waitForEvent steps. POST /v1/events finds them by (project, user, event name); '
    'resolving sets resolved_at (UPDATE ... WHERE resolved_at IS NULL RETURNING, so an event and '
    'a timeout cannot both win).';
CREATE INDEX workflow_waiters_open_idx ON workflow_waiters (project_id, user_id, event_name)
    WHERE resolved_at IS NULL;

CREATE TABLE workflow_digests (
    id                 uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id         uuid        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    workflow_id        text        NOT NULL,
    user_id            text        NOT NULL,
    step_index         integer     NOT NULL,
    owner_instance_id  uuid        NOT NULL
                                   REFERENCES workflow_instances (id) ON DELETE CASCADE,
    items              jsonb       NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(items) = 'array'),
    window_ends_at     timestamptz NOT NULL,
    closed_at          timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE workflow_digests IS
    'Open digest windows. The first instance to reach a digest step opens the window and owns '
    'it; instances arriving before window_ends_at append {"data", "at"} to items and stop. At '
    'most one open window per (project, workflow, user, step): INSERT ... ON CONFLICT '
    '(project_id, workflow_id, user_id, step_index) WHERE closed_at IS NULL DO UPDATE SET '
    'items = workflow_digests.items || EXCLUDED.items. The owner sets closed_at when it sends.';
CREATE UNIQUE INDEX workflow_digests_open_idx
    ON workflow_digests (project_id, workflow_id, user_id, step_index)
    WHERE closed_at IS NULL;

-- ---------------------------------------------------------------------------------------------
-- AI usage

CREATE TABLE ai_usage (
    task_id            text        PRIMARY KEY,
    project_id         uuid        NOT NULL,
    event_id           uuid,
    model              text        NOT NULL,
    prompt_tokens      integer     NOT NULL DEFAULT 0 CHECK (prompt_tokens >= 0),
    completion_tokens  integer     NOT NULL DEFAULT 0 CHECK (completion_tokens >= 0),
    created_at         timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE ai_usage IS
    'Tokens used per AI-written task (insert ON CONFLICT (task_id) DO NOTHING). Totals per '
    'project and period: SUM(...) WHERE project_id = $1 AND created_at >= $2.';
CREATE INDEX ai_usage_project_idx ON ai_usage (project_id, created_at);
