"""rmq's web dashboard: a server-rendered Starlette + Jinja2 app over :class:`rmq.client.admin.Admin`.

Pages (what rocketmq-dashboard has, plus lag in time and the actor processes):

- ``/cluster``: brokers by cluster with role, TPS, totals, CommitLog size, HA lag, disk, and a
  live throughput chart (``/api/tps``, sampled by the dashboard every :data:`SAMPLE_INTERVAL_S`);
- ``/topics``: search and filter (normal / retry / DLQ / system), paginated
  (:data:`PAGE_SIZE`), create; ``/topics/{topic}``: per-queue offsets, route, update, delete,
  send a test message;
- ``/groups``: subscription groups, paginated; ``/groups/{group}``: online clients, lag per queue
  in messages and in time, reset offset by time, skip the backlog;
- ``/messages``: by topic + key, by message id, by topic + time range (bounded by
  :data:`MAX_MESSAGES`); each shows body, properties and which groups consumed it, and can be
  resent to one group; ``/dlq``: the DLQ topics, browse one, resend a message to its original topic;
- ``/producers``: the producers online, by group;
- ``/actors``: the broker groups' actor processes (CPU, RSS, restarts) from their metrics endpoints
  (``metricsExporterType=PROM``); the cluster page's latency chart (``/api/latency``: mean and p99
  of the brokers' send requests) needs them too.

Every asset ships in the wheel (``templates/``, ``static/``): no CDN, no build step.  Binding
anything but loopback requires a token (:func:`create_app` ``token``): the login form sets a
cookie, API clients may send ``Authorization: Bearer <token>``.
"""
from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import signal
import threading
import time
import urllib.request
from collections import deque
from typing import Optional
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from rmq.client.admin import Admin
from rmq.common.mix_all import is_dlq_topic, is_retry_topic
from rmq.errors import RmqError

HERE = os.path.dirname(__file__)
DEFAULT_DASHBOARD_PORT = 8082           # rocketmq-dashboard's port
PAGE_SIZE = 200                         # topics / groups per page (RocketMQ dashboard #281: 900 topics timed out)
MAX_MESSAGES = 64                       # a message query returns at most this many (rocketmq-dashboard caps too)
SAMPLE_INTERVAL_S = 5.0                 # how often the dashboard samples broker TPS for its charts
SAMPLES_KEPT = 120                      # 10 minutes of samples
COOKIE = "rmq_dashboard_token"
TOPIC_KINDS = ("all", "normal", "retry", "dlq", "system")


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def topic_kind(topic: str) -> str:
    if is_retry_topic(topic):
        return "retry"
    if is_dlq_topic(topic):
        return "dlq"
    from rmq.metrics import is_system_topic
    if is_system_topic(topic) or topic == "DefaultCluster" or topic.startswith("rmq_"):
        return "system"
    return "normal"


def fmt_ts(ms: int) -> str:
    if not ms or ms <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


def fmt_age(ms: int) -> str:
    if ms <= 0:
        return "0 s"
    s = ms / 1000
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def paginate(request: Request, items: list) -> tuple:
    """(the items of the requested ``page`` (1-based, clamped), page number, page count); pages of
    :data:`PAGE_SIZE`."""
    try:
        page_no = max(1, int(request.query_params.get("page", "1")))
    except ValueError:
        page_no = 1
    pages = max(1, (len(items) + PAGE_SIZE - 1) // PAGE_SIZE)
    page_no = min(page_no, pages)
    return items[(page_no - 1) * PAGE_SIZE: page_no * PAGE_SIZE], page_no, pages


SEND_REQUEST_CODES = ("send_message", "send_message_v2", "send_batch_message")   # rocketmq_rpc_latency labels


def send_latency(text: str) -> tuple:
    """(sum ms, count, [(le ms, cumulative count)]) of the broker's send requests in a scrape of
    ``rocketmq_rpc_latency`` (every label set with a send request code, summed)."""
    from prometheus_client.parser import text_string_to_metric_families
    total, count, buckets = 0.0, 0.0, {}
    for fam in text_string_to_metric_families(text):
        if fam.name != "rocketmq_rpc_latency":
            continue
        for smp in fam.samples:
            if smp.labels.get("request_code") not in SEND_REQUEST_CODES:
                continue
            if smp.name.endswith("_sum"):
                total += smp.value
            elif smp.name.endswith("_count"):
                count += smp.value
            elif smp.name.endswith("_bucket"):
                le = float(smp.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + smp.value
    return total, count, sorted(buckets.items())


def latency_between(prev: tuple, cur: tuple) -> Optional[tuple]:
    """(mean ms, p99 ms) of the sends between two :func:`send_latency` readings; None without
    sends in between.  p99 is the upper bound of the bucket holding it (the last finite bound
    when it is past them all)."""
    n = cur[1] - prev[1]
    if n <= 0:
        return None
    before = dict(prev[2])
    target, p99 = 0.99 * n, None
    finite = [le for le, _ in cur[2] if le != float("inf")]
    for le, cum in cur[2]:
        if cum - before.get(le, 0.0) >= target:
            p99 = le if le != float("inf") else (finite[-1] if finite else 0.0)
            break
    return round((cur[0] - prev[0]) / n, 3), p99 if p99 is not None else (finite[-1] if finite else 0.0)


class _Sampler:
    """Samples every broker's put / get TPS, and its send latency from its metrics endpoint, for
    the live charts (a daemon thread)."""

    def __init__(self, app_state: "DashboardState"):
        self.state = app_state
        self.series: dict = {}        # broker_addr -> deque[(t_ms, put_tps, get_tps)]
        self.latency: dict = {}       # broker_addr -> deque[(t_ms, mean ms, p99 ms)]
        self._last_scrape: dict = {}  # broker_addr -> the previous send_latency reading
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rmq-dashboard-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def sample(self) -> None:
        try:
            brokers = self.state.call(lambda a: a.cluster_list())
        except RmqError:
            return
        now = int(time.time() * 1000)
        for b in brokers:
            if b.error:
                continue
            d = self.series.setdefault(b.broker_addr, deque(maxlen=SAMPLES_KEPT))
            d.append((now, round(b.put_tps, 1), round(b.get_tps, 1)))
            url = (b.runtime or {}).get("metricsUrl", "")
            if url:
                try:
                    with urllib.request.urlopen(url, timeout=SAMPLE_INTERVAL_S) as r:
                        cur = send_latency(r.read().decode())
                except (OSError, ValueError):
                    continue
                prev = self._last_scrape.get(b.broker_addr)
                self._last_scrape[b.broker_addr] = cur
                lat = latency_between(prev, cur) if prev is not None else None
                d = self.latency.setdefault(b.broker_addr, deque(maxlen=SAMPLES_KEPT))
                d.append((now, *(lat or (0.0, 0.0))))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_INTERVAL_S)


class DashboardState:
    """One Admin client shared by the request threads (its ZeroMQ sockets are used under a lock)."""

    def __init__(self, namesrv_addr: str, token: Optional[str]):
        self.namesrv_addr = namesrv_addr
        self.token = token
        self._lock = threading.Lock()
        self._admin: Optional[Admin] = None

    def call(self, fn):
        with self._lock:
            if self._admin is None:
                self._admin = Admin(self.namesrv_addr)
            return fn(self._admin)

    def close(self) -> None:
        with self._lock:
            if self._admin is not None:
                self._admin.close()
                self._admin = None


class _TokenAuth(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next):
        token = request.app.state.rmq.token
        if token is None or request.url.path in ("/login", "/healthz") or request.url.path.startswith("/static/"):
            return await call_next(request)
        given = request.cookies.get(COOKIE) or ""
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        if given and hmac.compare_digest(given.encode(), token.encode()):
            return await call_next(request)
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": "login required"}, status_code=401)
        return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)


def create_app(namesrv_addr: str, token: Optional[str] = None, sample: bool = True) -> Starlette:
    """The dashboard for the cluster behind ``namesrv_addr`` (host:port[;host:port]).

    ``token``: required from every browser (login form, cookie) or API client (Bearer header);
    None = no login (loopback only: :func:`serve` refuses otherwise).  ``sample``: run the TPS
    sampler thread (tests of single pages turn it off).
    """
    templates = Jinja2Templates(directory=os.path.join(HERE, "templates"))
    templates.env.filters["ts"] = fmt_ts
    templates.env.filters["age"] = fmt_age
    templates.env.filters["q"] = lambda v: quote(str(v), safe="")
    state = DashboardState(namesrv_addr, token)
    sampler = _Sampler(state)

    def page(request: Request, name: str, **ctx) -> Response:
        return templates.TemplateResponse(request, name, {"namesrv": namesrv_addr, "page": name.split(".")[0],
                                                          **ctx})

    def error_page(request: Request, title: str, e: Exception, status: int = 400) -> Response:
        return templates.TemplateResponse(request, "error.html", {"namesrv": namesrv_addr, "page": "error",
                                                                  "title": title, "error": str(e)},
                                          status_code=status)

    # -- cluster ----------------------------------------------------------------------------------------
    def cluster(request: Request) -> Response:
        try:
            brokers = state.call(lambda a: a.cluster_list())
        except RmqError as e:
            return error_page(request, "cluster", e, 502)
        rows = []
        for b in brokers:
            rt = b.runtime or {}
            rows.append({"b": b, "disk": rt.get("commitLogDiskRatio", -1), "flush_behind": rt.get("flushBehindBytes"),
                         "ha_lag_ms": rt.get("haLagMs", -1),
                         "dispatch_behind": rt.get("dispatchBehindBytes"), "metrics": rt.get("metricsUrl", "")})
        return page(request, "cluster.html", rows=rows)

    def api_tps(request: Request) -> Response:
        return JSONResponse({addr: list(d) for addr, d in sampler.series.items()})

    def api_latency(request: Request) -> Response:
        return JSONResponse({addr: list(d) for addr, d in sampler.latency.items()})

    # -- topics -----------------------------------------------------------------------------------------
    def topics(request: Request) -> Response:
        q = request.query_params.get("q", "").strip()
        kind = request.query_params.get("kind", "normal")
        kind = kind if kind in TOPIC_KINDS else "normal"
        try:
            names = state.call(lambda a: a.topic_list())
        except RmqError as e:
            return error_page(request, "topics", e, 502)
        sel = [t for t in names if (not q or q.lower() in t.lower()) and (kind == "all" or topic_kind(t) == kind)]
        shown, page_no, pages = paginate(request, sel)
        return page(request, "topics.html", topics=[(t, topic_kind(t)) for t in shown], q=q, kind=kind,
                    kinds=TOPIC_KINDS, total=len(sel), all_total=len(names), page_no=page_no, pages=pages,
                    message=request.query_params.get("message", ""))

    async def topic_create(request: Request) -> Response:
        form = await request.form()
        topic = str(form.get("topic", "")).strip()
        try:
            r, w, perm = int(form.get("read", 8)), int(form.get("write", 8)), int(form.get("perm", 6))
            state.call(lambda a: a.create_topic(topic, r, w, perm))
        except (RmqError, ValueError) as e:
            return error_page(request, f"create topic {topic}", e)
        return RedirectResponse(f"/topics/{quote(topic, safe='')}?message=created", status_code=303)

    def topic_page(request: Request, topic: str, sent=None) -> Response:
        try:
            status = state.call(lambda a: a.topic_status(topic))
            route = state.call(lambda a: a.topic_route(topic))
            stats = state.call(lambda a: a.stats_all(topic))
        except RmqError as e:
            return error_page(request, f"topic {topic}", e, 404)
        return page(request, "topic.html", topic=topic, status=status, route=route, stats=stats,
                    total=sum(s.max_offset - s.min_offset for s in status),
                    message=request.query_params.get("message", "") if sent is None else "", sent=sent)

    def topic_detail(request: Request) -> Response:
        return topic_page(request, request.path_params["topic"])

    async def topic_update(request: Request) -> Response:
        topic = request.path_params["topic"]
        form = await request.form()
        try:
            r, w, perm = int(form.get("read", 8)), int(form.get("write", 8)), int(form.get("perm", 6))
            state.call(lambda a: a.create_topic(topic, r, w, perm))
        except (RmqError, ValueError) as e:
            return error_page(request, f"update topic {topic}", e)
        return RedirectResponse(f"/topics/{quote(topic, safe='')}?message=updated", status_code=303)

    async def topic_delete(request: Request) -> Response:
        topic = request.path_params["topic"]
        try:
            state.call(lambda a: a.delete_topic(topic))
        except RmqError as e:
            return error_page(request, f"delete topic {topic}", e)
        return RedirectResponse(f"/topics?message={quote('deleted ' + topic)}", status_code=303)

    async def topic_send(request: Request) -> Response:
        topic = request.path_params["topic"]
        form = await request.form()
        body = str(form.get("body", ""))
        tags = str(form.get("tags", "")).strip() or None
        keys = [k for k in str(form.get("keys", "")).split() if k] or None
        try:
            sent = state.call(lambda a: a.send_message(topic, body.encode(), tags=tags, keys=keys))
        except RmqError as e:
            return error_page(request, f"send to {topic}", e)
        return topic_page(request, topic, sent)

    # -- groups -----------------------------------------------------------------------------------------
    def groups(request: Request) -> Response:
        q = request.query_params.get("q", "").strip()
        show_system = request.query_params.get("system") == "1"
        try:
            rows = state.call(lambda a: a.group_list())
        except RmqError as e:
            return error_page(request, "groups", e, 502)
        from rmq.metrics import is_system_group
        sel = [g for g in rows if (not q or q.lower() in g["group"].lower())
               and (show_system or not (is_system_group(g["group"]) or g["group"].startswith(("TOOLS_", "CID_ONS"))))]
        shown, page_no, pages = paginate(request, sel)
        return page(request, "groups.html", groups=shown, q=q,
                    system=show_system, total=len(sel), page_no=page_no, pages=pages)

    def group_detail(request: Request, message: str = "") -> Response:
        group = request.path_params["group"]
        try:
            clients = state.call(lambda a: a.consumer_connection(group))
        except RmqError as e:
            return error_page(request, f"group {group}", e, 404)
        progress, why = None, ""
        try:
            progress = state.call(lambda a: a.consumer_progress(group))
        except RmqError as e:
            why = str(e)
        now = int(time.time() * 1000)
        queues = [(qp, max(0, now - qp.lag_timestamp) if qp.lag_timestamp else 0)
                  for qp in (progress.queues if progress else [])]
        topics = sorted({qp.topic for qp, _ in queues})
        try:       # one statsAll pass for every topic of the group (not one per topic)
            plain = [t for t in topics if not is_retry_topic(t)]
            stats = [r for r in state.call(lambda a: a.stats_all(plain)) if r.consumer_group == group] if plain else []
        except RmqError:
            stats = []
        return page(request, "group.html", group=group, clients=clients, queues=queues, why=why, topics=topics,
                    stats=stats,
                    total=progress.total_diff if progress else 0,
                    message=message or request.query_params.get("message", ""))

    async def group_reset(request: Request) -> Response:
        group = request.path_params["group"]
        form = await request.form()
        topic = str(form.get("topic", "")).strip()
        when = str(form.get("when", "")).strip()
        try:
            if when == "now":
                ts = -1                       # skip the backlog: to the max offset
            else:
                ts = int(time.mktime(time.strptime(when, "%Y-%m-%dT%H:%M")) * 1000)
            moved = state.call(lambda a: a.reset_offset_by_time(group, topic, ts))
        except (RmqError, ValueError) as e:
            return error_page(request, f"reset offsets of {group}", e)
        return RedirectResponse(f"/groups/{quote(group, safe='')}?message={quote(f'reset {len(moved)} queues of {topic}')}",
                                status_code=303)

    # -- messages ---------------------------------------------------------------------------------------
    def messages(request: Request) -> Response:
        p = request.query_params
        topic, key, msg_id = p.get("topic", "").strip(), p.get("key", "").strip(), p.get("msgId", "").strip()
        begin, end = p.get("begin", "").strip(), p.get("end", "").strip()
        found, why, searched = [], "", False
        try:
            if msg_id:
                searched = True
                found = state.call(lambda a: a.query_msg_by_id(msg_id, topic or None))
            elif topic and key:
                searched = True
                found = state.call(lambda a: a.query_msg_by_key(topic, key, MAX_MESSAGES))
            elif topic:
                searched = True
                found = state.call(lambda a: by_time(a, topic, begin, end))
        except (RmqError, ValueError) as e:
            why = str(e)
        found = found[:MAX_MESSAGES]
        try:
            tracks = state.call(lambda a: a.message_tracks(found))
        except RmqError:
            tracks = [None] * len(found)
        return page(request, "messages.html", found=list(zip(found, tracks)), topic=topic, key=key, msg_id=msg_id,
                    begin=begin, end=end, why=why, searched=searched, max_messages=MAX_MESSAGES,
                    message=request.query_params.get("message", ""))

    async def message_resend(request: Request) -> Response:
        form = await request.form()
        msg_id, topic, group = str(form.get("msgId", "")), str(form.get("topic", "")), str(form.get("group", ""))
        try:
            sent = state.call(lambda a: a.resend_to_group(a.query_msg_by_id(msg_id, topic or None)[0], group))
        except RmqError as e:
            return error_page(request, f"resend {msg_id} to {group}", e)
        note = f"resent {msg_id} to group {group} ({sent.message_queue.topic}, offset {sent.queue_offset})"
        return RedirectResponse(f"/messages?msgId={quote(msg_id)}&topic={quote(topic)}&message={quote(note)}",
                                status_code=303)

    # -- producers --------------------------------------------------------------------------------------
    def producers(request: Request) -> Response:
        try:
            rows = state.call(lambda a: a.producer_list())
        except RmqError as e:
            return error_page(request, "producers", e, 502)
        return page(request, "producers.html", rows=rows)

    def dlq(request: Request) -> Response:
        try:
            names = [t for t in state.call(lambda a: a.topic_list()) if is_dlq_topic(t)]
            rows = []
            for t in names:
                st = state.call(lambda a: a.topic_status(t))
                rows.append((t, sum(s.max_offset - s.min_offset for s in st),
                             max((s.last_update_timestamp for s in st), default=0)))
        except RmqError as e:
            return error_page(request, "DLQ", e, 502)
        return page(request, "dlq.html", rows=rows, message=request.query_params.get("message", ""))

    async def dlq_resend(request: Request) -> Response:
        form = await request.form()
        msg_id, topic = str(form.get("msgId", "")), str(form.get("topic", ""))
        try:       # query_msg_by_id raises MQClientError when nothing has that id
            v = state.call(lambda a: a.query_msg_by_id(msg_id, topic or None))[0]
            target = v.properties.get("RETRY_TOPIC") or v.topic
            sent = state.call(lambda a: a.send_message(target, v.body, tags=v.tags or None, keys=v.keys or None))
        except RmqError as e:
            return error_page(request, "resend", e)
        return RedirectResponse(f"/dlq?message={quote(f'resent {msg_id} to {target} as {sent.msg_id}')}",
                                status_code=303)

    # -- actors -----------------------------------------------------------------------------------------
    def actors(request: Request) -> Response:
        try:
            brokers = state.call(lambda a: a.cluster_list())
        except RmqError as e:
            return error_page(request, "actors", e, 502)
        groups = []
        for b in brokers:
            url = (b.runtime or {}).get("metricsUrl", "")
            procs, why = [], ""
            if not url:
                why = "metrics off on this broker: set metricsExporterType=PROM in its broker.conf"
            else:
                try:
                    procs = scrape_actors(url)
                except (OSError, ValueError) as e:
                    why = f"{url}: {e}"
            groups.append((b, url, procs, why))
        return page(request, "actors.html", groups=groups)

    # -- login --------------------------------------------------------------------------------------------
    async def login(request: Request) -> Response:
        nxt = request.query_params.get("next", "/cluster")
        if not nxt.startswith("/") or nxt.startswith("//"):
            nxt = "/cluster"
        if request.method == "POST":
            form = await request.form()
            given = str(form.get("token", ""))
            if token is not None and hmac.compare_digest(given.encode(), token.encode()):
                resp = RedirectResponse(nxt, status_code=303)
                resp.set_cookie(COOKIE, given, httponly=True, samesite="strict")
                return resp
            return templates.TemplateResponse(request, "login.html", {"next": nxt, "bad": True, "page": "login",
                                                                      "namesrv": namesrv_addr}, status_code=401)
        return templates.TemplateResponse(request, "login.html", {"next": nxt, "bad": False, "page": "login",
                                                                  "namesrv": namesrv_addr})

    def healthz(request: Request) -> Response:
        return Response("ok\n", media_type="text/plain")

    def home(request: Request) -> Response:
        return RedirectResponse("/cluster", status_code=303)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if sample:
            sampler.start()
        try:
            yield
        finally:
            sampler.stop()
            state.close()

    routes = [
        Route("/", home), Route("/healthz", healthz), Route("/login", login, methods=["GET", "POST"]),
        Route("/cluster", cluster), Route("/api/tps", api_tps), Route("/api/latency", api_latency),
        Route("/topics", topics), Route("/topics", topic_create, methods=["POST"]),
        Route("/topics/{topic}", topic_detail), Route("/topics/{topic}/update", topic_update, methods=["POST"]),
        Route("/topics/{topic}/delete", topic_delete, methods=["POST"]),
        Route("/topics/{topic}/send", topic_send, methods=["POST"]),
        Route("/groups", groups), Route("/groups/{group}", group_detail),
        Route("/groups/{group}/reset", group_reset, methods=["POST"]),
        Route("/messages", messages), Route("/messages/resend", message_resend, methods=["POST"]),
        Route("/producers", producers), Route("/dlq", dlq), Route("/dlq/resend", dlq_resend, methods=["POST"]),
        Route("/actors", actors),
        Mount("/static", app=StaticFiles(directory=os.path.join(HERE, "static")), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(_TokenAuth)], lifespan=lifespan)
    app.state.rmq = state
    app.state.sampler = sampler
    return app


def by_time(admin: Admin, topic: str, begin: str, end: str) -> list:
    """Messages of ``topic`` stored in [begin, end] (``YYYY-MM-DDTHH:MM`` local time; empty: the last
    hour), at most :data:`MAX_MESSAGES`, oldest first: each queue read from its offset at ``begin``."""
    now = time.time()
    b = time.mktime(time.strptime(begin, "%Y-%m-%dT%H:%M")) if begin else now - 3600
    e = time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M")) + 60 if end else now + 60
    if e < b:
        raise ValueError("the end of the time range is before its begin")
    out = []
    for qs in admin.topic_status(topic):
        if qs.max_offset <= qs.min_offset:
            continue
        start = max(admin.search_offset(topic, qs.broker_name, qs.queue_id, int(b * 1000)), qs.min_offset)
        for v in admin.consume_message(topic, queue=qs.queue_id, offset=start, count=MAX_MESSAGES,
                                       broker_name=qs.broker_name):
            if b * 1000 <= v.store_timestamp <= e * 1000:
                out.append(v)
    out.sort(key=lambda v: v.store_timestamp)
    return out[:MAX_MESSAGES]


def scrape_actors(url: str, timeout_s: float = 5.0) -> list:
    """[(actor, pid, cpu seconds, rss bytes, restarts)] from a broker group's metrics endpoint
    (restarts: rocketmq_actor_restarts_total, 0 without a supervisor)."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        text = r.read().decode()
    cpu, rss, restarts = {}, {}, {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.labels.get("actor"), s.labels.get("pid"))
            if s.name == "rocketmq_actor_cpu_seconds_total":
                cpu[key] = s.value
            elif s.name == "rocketmq_actor_resident_memory_bytes":
                rss[key] = s.value
            elif s.name == "rocketmq_actor_restarts_total":
                restarts[s.labels.get("actor")] = int(s.value)
    return sorted((a, int(p), cpu.get((a, p), 0.0), int(rss.get((a, p), 0)), restarts.get(a, 0))
                  for a, p in set(cpu) | set(rss))


def serve(namesrv_addr: str, host: str = "127.0.0.1", port: int = DEFAULT_DASHBOARD_PORT,
          token: Optional[str] = None, ready=None) -> None:
    """Run the dashboard (uvicorn) until SIGINT / SIGTERM.  ``ready(url)`` is called once it
    listens (port 0: the one it got).

    Raises
    ------
    ValueError
        ``host`` is not loopback and no ``token`` is given.
    """
    if not is_loopback(host) and not token:
        raise ValueError(f"the dashboard binds {host}, beyond loopback: give a token file (--token-file) "
                         f"so that it asks for a login")
    import uvicorn

    app = create_app(namesrv_addr, token)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    if ready is not None:
        orig = server.startup

        async def startup(sockets=None):
            await orig(sockets=sockets)
            bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
            ready(f"http://{host}:{bound}")
        server.startup = startup
    if threading.current_thread() is threading.main_thread():
        # uvicorn re-raises the signal that stopped it once it has shut down; with these no-op
        # handlers in place that ends in a plain return (exit code 0), not a kill or a traceback
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
    server.run()
