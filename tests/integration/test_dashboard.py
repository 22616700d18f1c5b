"""The web dashboard (`rmq dashboard`) against a live cluster, in a real headless Chromium (selenium +
Debian's chromium-driver): every page loads with no console error, a message sent through the UI is
found by key, an offset reset moves the consumer.  Screenshots go to tests/artifacts/ (not committed).
Login rules are checked over HTTP (Starlette's TestClient)."""
import os
import shutil
import subprocess
import time

import msgpack
import pytest

from rmq.client.admin import Admin
from rmq.client.remoting import RemotingClient
from rmq.launch import child_env, python_cmd
from rmq.protocol import Frame, RequestCode
from tests.integration.cluster import Cluster
from tests.integration.conftest import ROOT
from tests.integration.test_broker import wait_for

pytestmark = pytest.mark.integration

ARTIFACTS = os.path.join(ROOT, "tests", "artifacts")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
PAGES = ("cluster", "topics", "groups", "producers", "messages", "dlq", "actors")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("dashboard") / "store",
                conf={"metricsExporterType": "PROM", "metricsPromExporterPort": "0"})
    yield c
    c.close()


@pytest.fixture(scope="module")
def dashboard(cluster):
    p = subprocess.Popen(python_cmd("-m", "rmq.cli", "dashboard", "--namesrv-addr", cluster.namesrv_addr,
                                    "--port", "0"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=child_env(None), cwd=ROOT)
    line = p.stdout.readline().strip()
    if not line.startswith("dashboard http://"):
        p.kill()
        raise AssertionError(f"dashboard did not start: {line!r} {p.stderr.read()[-3000:]}")
    yield line.split()[-1]
    p.terminate()
    p.wait(30)
    p.stdout.close()
    p.stderr.close()


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("Chromium and chromedriver are not installed (Debian: apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    d.set_page_load_timeout(60)
    os.makedirs(ARTIFACTS, exist_ok=True)
    yield d
    d.quit()


def console_errors(driver):
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def find(driver, by, what, timeout=30):
    """The element once the page that has it loaded (a form's submit navigates after click returns)."""
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout).until(EC.presence_of_element_located((by, what)))


def offsets_shown(driver, attempts=50):
    """The consumer offsets the group page shows; read again when the page re-renders the table
    between finding its cells and reading them (a stale element: the page is refreshing)."""
    from selenium.common.exceptions import StaleElementReferenceException
    for _ in range(attempts):
        try:
            return [e.text for e in driver.find_elements("css selector", "#progress td.consumer-offset")]
        except StaleElementReferenceException:
            time.sleep(0.05)
    raise AssertionError(f"the progress table kept re-rendering for {attempts} reads")


def shot(driver, name):
    driver.save_screenshot(os.path.join(ARTIFACTS, f"dashboard-{name}.png"))


def test_every_page_loads_without_console_errors(cluster, dashboard, browser):
    from selenium.webdriver.common.by import By
    with Admin(cluster.namesrv_addr) as a:
        a.create_topic("DashPages", 2, 2)
        a.send_message("DashPages", b"hello", tags="t", keys=["k1"])
    for name in PAGES:
        browser.get(f"{dashboard}/{name}")
        assert browser.find_element(By.TAG_NAME, "h1").text, name
        assert browser.find_element(By.ID, f"nav-{name}").get_attribute("class") == "on"
        assert console_errors(browser) == [], name
        shot(browser, name)
    browser.get(f"{dashboard}/topics/DashPages")
    assert "Topic DashPages" in browser.find_element(By.TAG_NAME, "h1").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#queues tbody tr")) == 2
    assert console_errors(browser) == []
    browser.get(f"{dashboard}/cluster")     # the live charts draw once the sampler has a point
    wait_for(lambda: (browser.find_elements(By.ID, "tps-chart-svg") and
                      browser.find_elements(By.ID, "latency-chart-svg")) or browser.refresh(), 30)
    assert console_errors(browser) == []
    shot(browser, "cluster-chart")
    rows = browser.find_elements(By.CSS_SELECTOR, "#brokers tbody tr")
    assert len(rows) == 1 and "broker-a" in rows[0].text
    assert browser.find_element(By.CSS_SELECTOR, "#brokers td.disk").text.endswith("%")
    browser.get(f"{dashboard}/actors")
    actors = browser.find_element(By.CSS_SELECTOR, "table.actors").text
    assert "broker" in actors and "reput" in actors and "flush" in actors
    # no supervisor here: no restarts file, every actor shows 0
    assert {e.text for e in browser.find_elements(By.CSS_SELECTOR, "table.actors td.restarts")} == {"0"}


def test_message_track_resend_to_a_group_and_producers_in_the_ui(cluster, dashboard, browser):
    """A message consumed by a live PushConsumer shows CONSUMED for its group; "Resend" delivers it
    to that group's listener again; the live producer is on the producers page."""
    import threading
    from selenium.webdriver.common.by import By
    from rmq import Message, Producer, PushConsumer
    got, lock = [], threading.Lock()

    def listener(msgs, ctx):
        with lock:
            got.extend(m.body for m in msgs)
    with Admin(cluster.namesrv_addr) as a:
        a.create_topic("DashTrack", 2, 2)
        wait_for(lambda: "DashTrack" in a.topic_list(), 30)
    c = PushConsumer(cluster.namesrv_addr, "DashTrackG", rebalance_interval_ms=300,
                     persist_consumer_offset_interval_ms=200, heartbeat_broker_interval_ms=1000)
    c.subscribe("DashTrack", "*")
    c.register_message_listener(listener)
    c.start()
    try:
        with Producer(cluster.namesrv_addr, group="DashPG") as p:
            r = p.send(Message("DashTrack", b"track me", keys=["trk-1"]))
            wait_for(lambda: got == [b"track me"], 60)
            browser.get(f"{dashboard}/producers")
            assert p.client_id in [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#producers td.client-id")]
            assert console_errors(browser) == []

        def consumed():           # the committed offset reaches the broker within ~200 ms
            browser.get(f"{dashboard}/messages?topic=DashTrack&key=trk-1")
            types = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "table.track td.track-type")]
            return types == ["CONSUMED"]
        wait_for(consumed, 30)
        assert "DashTrackG" in browser.find_element(By.CSS_SELECTOR, "table.track").text
        shot(browser, "message-track")
        browser.find_element(By.CSS_SELECTOR, "button.resend").click()
        assert f"resent {r.msg_id} to group DashTrackG" in find(browser, By.ID, "message").text
        wait_for(lambda: got == [b"track me", b"track me"], 60)
        assert console_errors(browser) == []
        browser.get(f"{dashboard}/topics/DashTrack")      # the topic's traffic table counts the send
        assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#traffic td.in-24h")] == ["1"]
        browser.get(f"{dashboard}/groups/DashTrackG")
        assert browser.find_element(By.CSS_SELECTOR, "#traffic td.out-24h").text in ("1", "2")
    finally:
        c.shutdown()


def test_message_sent_through_the_ui_is_found_by_key(cluster, dashboard, browser):
    from selenium.webdriver.common.by import By
    with Admin(cluster.namesrv_addr) as a:
        a.create_topic("DashSend", 4, 4)
    browser.get(f"{dashboard}/topics/DashSend")
    browser.find_element(By.ID, "send-body").send_keys('{"carrier": "UA"}')
    browser.find_element(By.ID, "send-tags").send_keys("UA")
    browser.find_element(By.ID, "send-keys").send_keys("N14228 flight-1")
    browser.find_element(By.ID, "send").click()
    msg_id = find(browser, By.ID, "sent-id").text
    assert len(msg_id) == 32
    assert console_errors(browser) == []

    def found():
        browser.get(f"{dashboard}/messages?topic=DashSend&key=N14228")
        ids = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "code.msg-id")]
        return ids if msg_id in ids else None
    assert wait_for(found, 30) == [msg_id]          # the IndexFile entry is written by reput
    assert '{"carrier": "UA"}' in browser.find_element(By.CSS_SELECTOR, "pre.body").text
    assert console_errors(browser) == []
    shot(browser, "message-by-key")
    browser.get(f"{dashboard}/messages?msgId={msg_id}")
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, "code.msg-id")] == [msg_id]


def test_offset_reset_in_the_ui_moves_the_consumer(cluster, dashboard, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    with Admin(cluster.namesrv_addr) as a:
        a.create_topic("DashReset", 1, 1)
        for i in range(20):
            a.send_message("DashReset", b"m%d" % i)
        wait_for(lambda: a.topic_status("DashReset")[0].max_offset == 20)
    with RemotingClient() as rc:     # the group consumed everything
        assert rc.invoke(cluster.broker, Frame(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                               fields={"groupName": "DashGroup"})).code == 0
        assert rc.invoke(cluster.broker, Frame(RequestCode.UPDATE_CONSUMER_OFFSET, fields={
            "consumerGroup": "DashGroup", "topic": "DashReset", "queueId": 0, "commitOffset": 20})).code == 0
        hb = {"clientID": "dash-client", "consumerDataSet": [{"groupName": "DashGroup", "subscriptionDataSet": []}],
              "producerDataSet": []}
        assert rc.invoke(cluster.broker, Frame(RequestCode.HEART_BEAT, bodies=[msgpack.packb(hb)])).code == 0
    browser.get(f"{dashboard}/groups/DashGroup")
    assert "dash-client" in browser.find_element(By.ID, "clients").text
    assert offsets_shown(browser) == ["20"]
    Select(browser.find_element(By.ID, "reset-topic")).select_by_visible_text("DashReset")
    when = browser.find_element(By.ID, "reset-when")
    browser.execute_script("arguments[0].value = arguments[1]", when,
                           time.strftime("%Y-%m-%dT%H:%M", time.localtime(time.time() - 3600)))
    browser.find_element(By.ID, "reset").click()
    assert "reset 1 queues of DashReset" in find(browser, By.ID, "message").text
    assert offsets_shown(browser) == ["0"]
    assert console_errors(browser) == []
    shot(browser, "group-reset")
    with Admin(cluster.namesrv_addr) as a:
        assert [q.consumer_offset for q in a.consumer_progress("DashGroup", "DashReset").queues] == [0]
    browser.get(f"{dashboard}/groups/DashGroup")
    browser.find_element(By.ID, "skip").click()         # skip the backlog: back to the end
    wait_for(lambda: offsets_shown(browser) == ["20"], 30)
    with Admin(cluster.namesrv_addr) as a:
        assert [q.consumer_offset for q in a.consumer_progress("DashGroup", "DashReset").queues] == [20]


def test_login_beyond_loopback(cluster):
    from starlette.testclient import TestClient
    from rmq.dashboard import create_app, serve
    with pytest.raises(ValueError, match="give a token file"):
        serve(cluster.namesrv_addr, host="0.0.0.0", port=0)
    with TestClient(create_app(cluster.namesrv_addr, token="s3cret", sample=False)) as c:
        r = c.get("/cluster", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/login?next=/cluster"
        assert c.get("/api/tps").status_code == 401
        assert c.get("/healthz").status_code == 200
        bad = c.post("/login?next=/topics", data={"token": "nope"}, follow_redirects=False)
        assert bad.status_code == 401 and "wrong token" in bad.text
        ok = c.post("/login?next=//evil.example", data={"token": "s3cret"}, follow_redirects=False)
        assert ok.status_code == 303 and ok.headers["location"] == "/cluster"    # no open redirect
        assert c.get("/cluster").status_code == 200          # the cookie
    with TestClient(create_app(cluster.namesrv_addr, token="s3cret", sample=False)) as c:
        assert c.get("/api/tps", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_bad_input_changes_nothing(cluster):
    """A form with a bad value answers with the error named and creates nothing."""
    from starlette.testclient import TestClient
    from rmq.dashboard import create_app
    with TestClient(create_app(cluster.namesrv_addr, sample=False)) as c:
        r = c.post("/topics", data={"topic": "bad/topic", "read": "8", "write": "8", "perm": "6"})
        assert r.status_code == 400 and "bad/topic" in r.text
        r = c.post("/topics", data={"topic": "Fine", "read": "x"})
        assert r.status_code == 400
        r = c.post("/groups/NoGroup/reset", data={"topic": "DashReset", "when": "yesterday"})
        assert r.status_code == 400
        assert c.get("/topics/NoSuchTopic").status_code == 404
    with Admin(cluster.namesrv_addr) as a:
        assert "Fine" not in a.topic_list() and "bad/topic" not in a.topic_list()


def test_send_latency_from_a_scrape():
    from rmq.dashboard.app import latency_between, send_latency
    def text(count, total, buckets):
        lines = ["# HELP rocketmq_rpc_latency x", "# TYPE rocketmq_rpc_latency histogram"]
        for code in ("send_message", "pull_message"):
            for le, n in buckets:
                lines.append(f'rocketmq_rpc_latency_bucket{{request_code="{code}",le="{le}"}} {n}')
            lines.append(f'rocketmq_rpc_latency_count{{request_code="{code}"}} {count}')
            lines.append(f'rocketmq_rpc_latency_sum{{request_code="{code}"}} {total}')
        return "\n".join(lines) + "\n"
    a = send_latency(text(10, 5.0, [("1.0", 10), ("5.0", 10), ("+Inf", 10)]))
    b = send_latency(text(110, 105.0, [("1.0", 20), ("5.0", 109), ("+Inf", 110)]))
    assert a[1] == 10 and a[0] == 5.0                       # pulls are not sends
    mean, p99 = latency_between(a, b)
    assert mean == 1.0 and p99 == 5.0                        # 99 of 100 new sends within 5 ms
    assert latency_between(b, b) is None
    c = send_latency(text(210, 905.0, [("1.0", 20), ("5.0", 109), ("+Inf", 210)]))
    assert latency_between(b, c)[1] == 5.0                   # past every bucket: the last finite bound


def test_an_empty_or_missing_token_file_is_refused(cluster, tmp_path):
    """`rmq dashboard --token-file` and the supervised actor refuse an empty token: exit 1, one
    line naming the file, nothing served."""
    from click.testing import CliRunner
    from rmq.cli import main
    empty = tmp_path / "token.txt"
    empty.write_text("\n")
    r = CliRunner().invoke(main, ["dashboard", "--namesrv-addr", cluster.namesrv_addr, "--port", "0",
                                  "--token-file", str(empty)])
    assert r.exit_code == 1 and "the first line (the token) is empty" in r.output
    for path in (empty, tmp_path / "missing.txt"):
        p = subprocess.run(python_cmd("-m", "rmq.dashboard.actor", "--namesrv-addr", cluster.namesrv_addr,
                                      "--port", "0", "--token-file", str(path)),
                           capture_output=True, text=True, timeout=60, env=child_env(None), cwd=ROOT)
        assert p.returncode == 1 and "dashboard: refusing to start" in p.stderr and "ready" not in p.stdout
        assert "Traceback" not in p.stderr
