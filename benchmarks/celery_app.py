"""The Celery baseline: what a Python team would otherwise build for one notification.

One task per notification does the same work notifkit's send path does for it: load the user
and their address from PostgreSQL, render the template with sandboxed Jinja2, POST it to the
Resend simulator (same headers and idempotency key as notifkit's transport) and write one
``message_logs`` row. ``acks_late`` keeps Celery at-least-once like notifkit (the message is
acked after the task ran). Compiled templates and connections are reused per worker process.

    celery -A benchmarks.celery_app worker -P prefork -c 8 -Q <queue>

Configured from the environment by the benchmark runner (BENCH_CELERY_*).
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
import requests
from celery import Celery
from jinja2.sandbox import SandboxedEnvironment

from notifkit.ids import derived_uuid7

BROKER = os.environ.get("BENCH_CELERY_BROKER", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("BENCH_CELERY_QUEUE", "bench-celery")
# Every key the broker transport writes starts with this (the run's namespace), so the run
# removes them all afterwards, kombu's shared bookkeeping keys included.
KEY_PREFIX = os.environ.get("BENCH_CELERY_KEY_PREFIX", "")

app = Celery("notifkit_bench", broker=BROKER)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    task_acks_late=True,
    worker_prefetch_multiplier=16,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    broker_transport_options={"global_keyprefix": KEY_PREFIX},
)



def configure(broker: str, queue: str, key_prefix: str) -> None:
    """Point the producer side (the benchmark runner) at the run's broker, queue and keys."""
    app.conf.broker_url = broker
    app.conf.task_default_queue = queue
    app.conf.broker_transport_options = {"global_keyprefix": key_prefix}


_state: dict[str | tuple[str, ...], Any] = {}
_jinja = SandboxedEnvironment(autoescape=False)


def _db() -> psycopg.Connection[Any]:
    conn = _state.get("db")
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["BENCH_DATABASE_URL"], autocommit=True)
        conn.execute(f'SET search_path TO "{os.environ["BENCH_DB_SCHEMA"]}"')
        _state["db"] = conn
    return conn


def _http() -> requests.Session:
    session = _state.get("http")
    if session is None:
        session = requests.Session()
        session.mount("http://", requests.adapters.HTTPAdapter(pool_connections=1,
                                                               pool_maxsize=4))
        _state["http"] = session
    return session


def _templates(project_id: str, template_id: str) -> dict[str, Any]:
    key = ("template", project_id, template_id)
    compiled = _state.get(key)
    if compiled is None:
        row = _db().execute("SELECT content FROM templates WHERE project_id = %s AND id = %s",
                            (project_id, template_id)).fetchone()
        assert row is not None, f"no template {template_id}"
        email = row[0]["email"]
        compiled = {name: _jinja.from_string(text) for name, text in email.items()}
        _state[key] = compiled
    return compiled


@app.task(name="bench.send_notification")
def send_notification(project_id: str, event_id: str, user_id: str, template_id: str,
                      data: dict[str, Any]) -> None:
    db = _db()
    user = db.execute(
        "SELECT u.id, u.attributes, u.timezone, u.locale, c.target FROM users u "
        "JOIN user_contacts c ON c.project_id = u.project_id AND c.user_id = u.id "
        "AND c.channel = 'email' AND c.enabled WHERE u.project_id = %s AND u.id = %s "
        "ORDER BY c.created_at LIMIT 1", (project_id, user_id)).fetchone()
    if user is None:
        return
    context = {"user": {"id": user[0], "attributes": user[1], "timezone": user[2],
                        "locale": user[3]}, "data": data}
    content = {name: t.render(context) for name, t in _templates(project_id, template_id).items()}
    task_id = derived_uuid7(event_id, user_id, "email")
    reply = _http().post(
        f"{os.environ['BENCH_SIM_URL']}/emails",
        json={"from": "notifkit <noreply@example.com>", "to": [user[4]],
              "subject": content.get("subject", ""), "text": content.get("text", ""),
              "tags": [{"name": "notifkit_task_id", "value": task_id}]},
        headers={"Authorization": "Bearer sim-placeholder-key", "Idempotency-Key": task_id,
                 "X-Notifkit-Task-Id": task_id},
        timeout=10,
    )
    reply.raise_for_status()
    db.execute(
        "INSERT INTO message_logs (project_id, event_id, task_id, user_id, channel, attempt, "
        "kind, status, detail, provider, provider_message_id) VALUES "
        "(%s, %s, %s, %s, 'email', 1, 'sent', 'sent', 'accepted by resend', 'resend', %s) "
        "ON CONFLICT (task_id, channel, attempt, kind) DO NOTHING",
        (project_id, event_id, task_id, user_id, reply.json().get("id")))
