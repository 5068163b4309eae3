"""API keys and quotas against a real runtime process: the 401/403/429 tables through Triton's own
clients (HTTP and gRPC, the key as a header or as metadata), health still open, keys rotated the
way the kubelet rotates a mounted Secret while load runs, a bad key file, and a noisy client held
to its quota while another key's requests stay inside the SLA (the server's own histogram)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from batchpilot.runtime.loadgen import LoadConfig, RateSchedule, Target, run_load
from tests.runtime_process import (
    RuntimeProcess,
    Scrape,
    refused_start,
    runtime_process,
    send,
)
from tests.test_server_process import mlp_rows, v2_request
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ALICE = "alice-0123456789abcdef0123"
BOB = "bob-0123456789abcdef012345"
BULK_HTTP = "bulk-http-0123456789abcdef"
BULK_GRPC = "bulk-grpc-0123456789abcdef"
BULK_STREAM = "bulk-stream-0123456789abcd"
STATS_PATHS = ("/v2/models/mlp/stats", "/v2/models/stats")
"""Triton's statistics extension: the model's, and every model's (the one served)."""
KEYS = {
    "alice": ALICE,
    "bob": BOB,
    "bulk-http": BULK_HTTP,
    "bulk-grpc": BULK_GRPC,
    "bulk-stream": BULK_STREAM,
}
ACCESS = {
    # bob is known, not allowed here
    "allowedKeyIds": ["alice", "bulk-http", "bulk-grpc", "bulk-stream"],
    "keyQuotas": [
        # two requests, then one every 100 s: the third is refused whatever the machine's pace
        {"keyId": "bulk-http", "requestsPerSecond": 0.01, "burst": 2},
        {"keyId": "bulk-grpc", "requestsPerSecond": 0.01, "burst": 2},
        {"keyId": "bulk-stream", "requestsPerSecond": 0.01, "burst": 2},
    ],
}


def publish(folder: Path, keys: dict[str, str]) -> None:
    """Write `keys` into `folder` as the kubelet updates a mounted Secret (its AtomicWriter): the
    new version in a fresh `..<timestamp>` folder, the `..data` symlink swapped to it by one
    rename, a symlink per key through `..data`, the old version removed."""
    folder.mkdir(exist_ok=True)
    version = folder / f"..{time.time_ns()}"
    version.mkdir()
    for key_id, key in keys.items():
        (version / key_id).write_text(key + "\n")
    data = folder / "..data"
    old = os.readlink(data) if data.is_symlink() else None
    (folder / "..data_tmp").symlink_to(version.name)
    os.replace(folder / "..data_tmp", data)
    for key_id in keys:
        if not (folder / key_id).is_symlink():
            (folder / key_id).symlink_to(f"..data/{key_id}")
    for name in os.listdir(folder):
        if not name.startswith("..") and name not in keys:
            (folder / name).unlink()
    if old is not None:
        shutil.rmtree(folder / old)


def write_document(path: Path, doc: Any) -> None:
    """Replace the file in one rename, as the kubelet replaces a ConfigMap's."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps(doc))
    os.replace(tmp, path)


def key_args(folder: Path, access: Path | None = None) -> tuple[str, ...]:
    return (
        "--api-keys",
        str(folder),
        *(("--access-config", str(access)) if access is not None else ()),
    )


FAST_POLL = {"BATCHPILOT_CONFIG_POLL_S": "0.1"}
"""The mounted files looked at ten times a second: the tests wait less for a change."""


def count(scrape: Scrape, name: str, **labels: str) -> float:
    """A counter's value; 0 before its first series."""
    try:
        return scrape.value(name, **labels)
    except AssertionError:
        return 0.0


def by_key(scrape: Scrape, key_id: str, outcome: str) -> float:
    return count(scrape, "batchpilot_requests_by_key_total", key_id=key_id, outcome=outcome)


def reloads(server: RuntimeProcess, source: str, result: str) -> float:
    return count(Scrape(server), "batchpilot_access_reloads_total", source=source, result=result)


@pytest.fixture(scope="module")
def keyed(mlp_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    where = tmp_path_factory.mktemp("keyed")
    publish(where / "keys", KEYS)
    write_document(where / "access.json", ACCESS)
    with runtime_process(
        mlp_model,
        *key_args(where / "keys", where / "access.json"),
        log_dir=where,
        grpc=True,
        env=FAST_POLL,
    ) as server:
        yield server


def http_infer(server: RuntimeProcess, headers: dict[str, str]) -> None:
    client = thttp.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        x = thttp.InferInput("x", [1, 64], "FP32")
        x.set_data_from_numpy(mlp_rows(1, seed=0)["x"])
        client.infer("mlp", [x], headers=dict(headers))  # it adds its own to the dict
    finally:
        client.close()


def grpc_infer(server: RuntimeProcess, headers: dict[str, str]) -> None:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        x = tgrpc.InferInput("x", [1, 64], "FP32")
        x.set_data_from_numpy(mlp_rows(1, seed=0)["x"])
        client.infer("mlp", [x], headers=headers)
    finally:
        client.close()


def status_of(call: Callable[[], None]) -> str:
    """ "ok", or the status tritonclient reports: "401" over HTTP, "StatusCode.UNAUTHENTICATED"
    over gRPC."""
    try:
        call()
    except InferenceServerException as exc:
        return str(exc.status())
    return "ok"


def stream_errors(server: RuntimeProcess, headers: dict[str, str], count: int) -> list[str]:
    """Each of `count` requests' error on one ModelStreamInfer stream, in the order sent ("" for
    an answer), through tritonclient's streaming API."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        client.start_stream(
            callback=lambda result, error: answers.put((result, error)), headers=headers
        )
        x = tgrpc.InferInput("x", [1, 64], "FP32")
        x.set_data_from_numpy(mlp_rows(1, seed=0)["x"])
        errors = []
        for n in range(count):
            # One at a time: the quota's refusals fall on the last requests sent.
            # A stream the server refused at once may have ended already: its error comes to
            # the callback either way.
            with contextlib.suppress(InferenceServerException):
                client.async_stream_infer("mlp", [x], request_id=f"q{n}")
            _, error = answers.get(timeout=10)
            errors.append("" if error is None else str(error))
        return errors
    finally:
        client.stop_stream()
        client.close()


class TestTheAnswers:
    @pytest.mark.parametrize(
        ("headers", "http", "grpc"),
        [
            ({}, "401", "StatusCode.UNAUTHENTICATED"),
            ({"Authorization": "Bearer not-a-key-0123456789"}, "401", "StatusCode.UNAUTHENTICATED"),
            ({"Authorization": f"Basic {ALICE}"}, "401", "StatusCode.UNAUTHENTICATED"),
            ({"x-api-key": BOB}, "403", "StatusCode.PERMISSION_DENIED"),
            ({"Authorization": f"Bearer {ALICE}"}, "ok", "ok"),
            ({"x-api-key": ALICE}, "ok", "ok"),
        ],
        ids=["no-key", "unknown-key", "not-bearer", "not-allowed", "bearer", "x-api-key"],
    )
    def test_through_tritonclient(
        self, keyed: RuntimeProcess, headers: dict[str, str], http: str, grpc: str
    ) -> None:
        assert status_of(lambda: http_infer(keyed, headers)) == http
        # gRPC metadata keys are lower-case
        metadata = {name.lower(): value for name, value in headers.items()}
        assert status_of(lambda: grpc_infer(keyed, metadata)) == grpc
        # A stream is refused whole to a caller without an allowed key.
        streamed = stream_errors(keyed, metadata, 1)[0]
        if grpc == "ok":
            assert streamed == "", streamed
        else:
            assert grpc in streamed, streamed

    def test_over_quota_is_429_with_retry_after_over_http_and_resource_exhausted_over_grpc(
        self, keyed: RuntimeProcess
    ) -> None:
        before = Scrape(keyed)
        http_key = {"x-api-key": BULK_HTTP}
        assert [status_of(lambda: http_infer(keyed, http_key)) for _ in range(3)] == [
            "ok",
            "ok",
            "429",
        ]
        body, headers = v2_request(mlp_rows(1, seed=0))
        reply = send(keyed, "POST", "/v2/models/mlp/infer", body, {**headers, **http_key})
        assert reply.status == 429
        assert 90 <= int(reply.headers["retry-after"]) <= 100  # a token every 100 s
        assert (
            "key 'bulk-http' is over its quota (0.01 requests/s, burst 2)" in reply.json()["error"]
        )
        grpc_key = {"x-api-key": BULK_GRPC}
        assert [status_of(lambda: grpc_infer(keyed, grpc_key)) for _ in range(3)] == [
            "ok",
            "ok",
            "StatusCode.RESOURCE_EXHAUSTED",
        ]
        after = Scrape(keyed)
        assert (
            by_key(after, "bulk-http", "over_quota") - by_key(before, "bulk-http", "over_quota")
            == 2
        )
        assert by_key(after, "bulk-grpc", "admitted") - by_key(before, "bulk-grpc", "admitted") == 2
        # On a stream the quota holds request by request, each refusal an answer of the stream.
        errors = stream_errors(keyed, {"x-api-key": BULK_STREAM}, 3)
        assert errors[:2] == ["", ""], errors
        assert "RESOURCE_EXHAUSTED: key 'bulk-stream' is over its quota" in errors[2], errors
        # refusals at the gate are not the model's requests: they never reached the queue
        assert (
            after.value("batchpilot_arrivals_total") - before.value("batchpilot_arrivals_total")
            == 4
        )

    def test_a_401_challenges_and_never_echoes_the_key(self, keyed: RuntimeProcess) -> None:
        body, headers = v2_request(mlp_rows(1, seed=0))
        bare = send(keyed, "POST", "/v2/models/mlp/infer", body, headers)
        assert bare.status == 401
        assert bare.headers["www-authenticate"] == 'Bearer realm="batchpilot"'
        assert "Authorization: Bearer <key>" in bare.json()["error"]
        wrong = send(
            keyed,
            "POST",
            "/v2/models/mlp/infer",
            body,
            {**headers, "Authorization": "Bearer wrong-key-0123456789"},
        )
        assert wrong.status == 401
        assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
        assert b"wrong-key" not in wrong.body
        scrape = send(keyed, "GET", "/metrics").body
        assert b"wrong-key" not in scrape
        assert ALICE.encode() not in scrape

    def test_health_and_server_metadata_stay_open_model_metadata_and_config_need_a_key(
        self, keyed: RuntimeProcess
    ) -> None:
        for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/mlp/ready", "/v2"):
            assert send(keyed, "GET", path).status == 200, path
        for path in ("/v2/models/mlp", "/v2/models/mlp/config", *STATS_PATHS):
            assert send(keyed, "GET", path).status == 401, path
            assert send(keyed, "GET", path, headers={"x-api-key": BOB}).status == 403, path
            assert send(keyed, "GET", path, headers={"x-api-key": ALICE}).status == 200, path
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{keyed.grpc_port}")
        try:
            assert client.is_server_live()
            assert client.is_server_ready()
            assert client.is_model_ready("mlp")
            with pytest.raises(InferenceServerException, match="needs an API key"):
                client.get_model_metadata("mlp")
            assert client.get_model_metadata("mlp", headers={"x-api-key": ALICE}).name == "mlp"
            with pytest.raises(InferenceServerException, match="needs an API key"):
                client.get_model_config("mlp")
            config = client.get_model_config("mlp", headers={"x-api-key": ALICE})
            assert config.config.name == "mlp"
            for model in ("mlp", ""):  # "": every model's
                with pytest.raises(InferenceServerException, match="needs an API key"):
                    client.get_inference_statistics(model)
                with pytest.raises(InferenceServerException, match="may not call model"):
                    client.get_inference_statistics(model, headers={"x-api-key": BOB})
                stats = client.get_inference_statistics(model, headers={"x-api-key": ALICE})
                assert stats.model_stats[0].name == "mlp"
        finally:
            client.close()

    def test_async_inference_needs_a_key_too(self, keyed: RuntimeProcess) -> None:
        body, headers = v2_request(mlp_rows(1, seed=0))
        path = "/v2/models/mlp/infer/async"
        assert send(keyed, "POST", path, body, headers).status == 401
        submitted = send(keyed, "POST", path, body, {**headers, "x-api-key": ALICE})
        assert submitted.status == 202
        location = submitted.headers["location"] + "?wait_s=5"
        assert send(keyed, "GET", location).status == 401
        assert send(keyed, "GET", location, headers={"x-api-key": ALICE}).status == 200


class TestBadKeysAtStart:
    @pytest.mark.parametrize(
        ("keys", "access", "message"),
        [
            (None, None, "cannot be read"),
            ({"alice": "short"}, None, "'alice' has 5 characters"),
            ({"-x": ALICE}, None, "a key id is 1 to 63 letters"),
            (KEYS, {"defaultQuota": {"requestsPerSecond": -5}}, "from 0.01 to 100000"),
        ],
        ids=["missing-folder", "short-key", "bad-id", "negative-quota"],
    )
    def test_a_server_never_starts_open_or_half_configured(
        self,
        mlp_model: Path,
        tmp_path: Path,
        keys: dict[str, str] | None,
        access: Any,
        message: str,
    ) -> None:
        if keys is not None:
            publish(tmp_path / "keys", keys)
        args = ["--model", str(mlp_model), "--api-keys", str(tmp_path / "keys")]
        if access is not None:
            write_document(tmp_path / "access.json", access)
            args += ["--access-config", str(tmp_path / "access.json")]
        log = refused_start(*args, log_path=tmp_path / "log")
        assert message in log, log
        assert ALICE not in log


class TestRotation:
    def test_rotating_under_load_loses_nothing(self, mlp_model: Path, tmp_path: Path) -> None:
        """Two clients on kept-alive connections, one per key, while the Secret changes: the
        retired key's requests go from 200 to 401 at one point, the kept key's are all 200,
        and nothing else happens to either — no 5xx, no reset connection."""
        old, kept, new = (
            "old-0123456789abcdef0123",
            "kept-0123456789abcdef012",
            "new-0123456789abcdef01234",
        )
        publish(tmp_path / "keys", {"old": old, "kept": kept})
        with runtime_process(
            mlp_model, *key_args(tmp_path / "keys"), log_dir=tmp_path, env=FAST_POLL
        ) as server:
            body, headers = v2_request(mlp_rows(1, seed=0))
            stop = threading.Event()
            seen: dict[str, list[int | str]] = {"old": [], "kept": []}

            def client(name: str, key: str) -> None:
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
                try:
                    while not stop.is_set():
                        try:
                            conn.request(
                                "POST",
                                "/v2/models/mlp/infer",
                                body=body,
                                headers={**headers, "Authorization": f"Bearer {key}"},
                            )
                            response = conn.getresponse()
                            response.read()
                            seen[name].append(response.status)
                        except (OSError, http.client.HTTPException) as exc:
                            seen[name].append(type(exc).__name__)
                            return
                finally:
                    conn.close()

            threads = [
                threading.Thread(target=client, args=(n, k))
                for n, k in (("old", old), ("kept", kept))
            ]
            for thread in threads:
                thread.start()
            try:
                wait_until(lambda: len(seen["old"]) >= 20, what="requests before the rotation")
                publish(tmp_path / "keys", {"kept": kept, "new": new})
                wait_until(lambda: 401 in seen["old"], what="the retired key refused")
                mark = len(seen["kept"])
                wait_until(lambda: len(seen["kept"]) >= mark + 20, what="requests after it")
            finally:
                stop.set()
                for thread in threads:
                    thread.join(timeout=15)
            first_refusal = seen["old"].index(401)
            assert first_refusal >= 20
            assert set(seen["old"][:first_refusal]) == {200}, seen["old"]
            assert set(seen["old"][first_refusal:]) == {401}, seen["old"]
            assert set(seen["kept"]) == {200}, seen["kept"]
            reply = send(
                server,
                "POST",
                "/v2/models/mlp/infer",
                body,
                {**headers, "Authorization": f"Bearer {new}"},
            )
            assert reply.status == 200
            scrape = Scrape(server)
            assert scrape.value("batchpilot_api_keys") == 2
            assert reloads(server, "keys", "applied") == 1

    def test_a_broken_secret_keeps_the_keys_in_force_and_says_so(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        keys = tmp_path / "keys"
        publish(keys, {"alice": ALICE})
        write_document(tmp_path / "access.json", {})
        args = key_args(keys, tmp_path / "access.json")
        with runtime_process(mlp_model, *args, log_dir=tmp_path, env=FAST_POLL) as server:
            publish(keys, {"alice": "short"})
            wait_until(
                lambda: reloads(server, "keys", "refused") == 1,
                what="the refused key file counted",
            )
            write_document(tmp_path / "access.json", {"totalQuota": {"requestsPerSecond": 0}})
            wait_until(
                lambda: reloads(server, "access", "refused") == 1,
                what="the refused access document counted",
            )
            assert send(server, "GET", "/v2/models/mlp", headers={"x-api-key": ALICE}).status == 200
            assert send(server, "GET", "/v2/models/mlp").status == 401  # still closed
            log = server.log()
            assert "the keys and limits in force stay" in log
            assert "'alice' has 5 characters" in log

    def test_limits_change_live(self, mlp_model: Path, tmp_path: Path) -> None:
        publish(tmp_path / "keys", {"alice": ALICE})
        write_document(tmp_path / "access.json", {})
        args = key_args(tmp_path / "keys", tmp_path / "access.json")
        body, headers = v2_request(mlp_rows(1, seed=0))
        keyed = {**headers, "x-api-key": ALICE}
        with runtime_process(mlp_model, *args, log_dir=tmp_path, env=FAST_POLL) as server:
            assert all(
                send(server, "POST", "/v2/models/mlp/infer", body, keyed).status == 200
                for _ in range(5)
            )
            write_document(
                tmp_path / "access.json",
                {"defaultQuota": {"requestsPerSecond": 0.01, "burst": 1}},
            )
            wait_until(
                lambda: reloads(server, "access", "applied") == 1,
                what="the new limits applied",
            )
            statuses = [
                send(server, "POST", "/v2/models/mlp/infer", body, keyed).status for _ in range(3)
            ]
            assert statuses == [200, 429, 429]
            write_document(tmp_path / "access.json", {"allowedKeyIds": []})
            wait_until(
                lambda: send(server, "POST", "/v2/models/mlp/infer", body, keyed).status == 403,
                what="alice no longer allowed",
            )

    def test_the_operator_changes_limits_at_once_through_the_admin_port(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        """`PUT /admin/access` (what the operator sends each ready pod) applies at once, needs the
        admin token, is refused whole when bad, and the same document arriving later as the
        mounted file changes nothing."""
        publish(tmp_path / "keys", {"alice": ALICE})
        write_document(tmp_path / "access.json", {})
        (tmp_path / "admin-token").write_text("admin-secret\n")
        args = (
            *key_args(tmp_path / "keys", tmp_path / "access.json"),
            "--admin-token-file",
            str(tmp_path / "admin-token"),
        )
        body, headers = v2_request(mlp_rows(1, seed=0))
        keyed = {**headers, "x-api-key": ALICE}
        tight = orjson.dumps({"defaultQuota": {"requestsPerSecond": 0.01, "burst": 1}})
        with runtime_process(mlp_model, *args, log_dir=tmp_path, env=FAST_POLL) as server:
            admin = server.admin_port

            def put(document: bytes, token: str | None) -> int:
                auth = {} if token is None else {"Authorization": f"Bearer {token}"}
                return send(server, "PUT", "/admin/access", document, auth, port=admin).status

            assert put(tight, None) == 401
            assert put(tight, "wrong") == 401
            assert put(b'{"defaultQuota": {"requestsPerSecond": -1}}', "admin-secret") == 400
            assert send(server, "POST", "/v2/models/mlp/infer", body, keyed).status == 200
            assert put(tight, "admin-secret") == 200
            statuses = [
                send(server, "POST", "/v2/models/mlp/infer", body, keyed).status for _ in range(2)
            ]
            assert statuses == [200, 429]  # at once: no file, no poll
            assert reloads(server, "admin", "applied") == 1
            assert reloads(server, "admin", "refused") == 1
            in_force = send(server, "GET", "/admin/access", b"", {}, port=admin)
            assert orjson.loads(in_force.body)["defaultQuota"]["requestsPerSecond"] == 0.01
            # The ConfigMap catches up with the same document: nothing changes, the bucket
            # stays empty.
            write_document(tmp_path / "access.json", orjson.loads(tight))
            time.sleep(0.5)  # five polls of the file: a change would have been applied by now
            assert reloads(server, "access", "applied") == 0
            assert send(server, "POST", "/v2/models/mlp/infer", body, keyed).status == 429


ALPHA_MS, BETA_MS, MAX_BATCH = 40.0, 2.0, 8
CAPACITY_RPS = MAX_BATCH / (ALPHA_MS + BETA_MS * MAX_BATCH) * 1e3  # 8 / 56 ms = 143 rps
SLA_MS = 500.0
"""Loose for a shared two-core machine: a batch takes at most 56 ms, so only the queue (what
an unlimited noisy client would fill) can push a request near it."""


def p99_ms(scrape: Scrape) -> float:
    """The histogram's P99, as Prometheus's histogram_quantile interpolates it."""
    buckets = scrape.buckets("batchpilot_request_duration_seconds")
    total = buckets[-1][1]
    rank, lower, below = 0.99 * total, 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower * 1e3
            return (lower + (upper - lower) * (rank - below) / max(count - below, 1e-9)) * 1e3
        lower, below = upper, count
    return float("nan")


class TestNoisyNeighbour:
    async def test_a_noisy_key_is_held_to_its_quota_and_the_other_keeps_its_sla(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        """One simulated replica of about 143 rps. The noisy key offers 1.4 times that, but its
        quota admits 30 rps; the quiet key's 15 rps are all served, and the server's P99 over
        everything it took on stays inside the SLA."""
        noisy, quiet = "noisy-0123456789abcdef012", "quiet-0123456789abcdef012"
        publish(tmp_path / "keys", {"noisy": noisy, "quiet": quiet})
        write_document(
            tmp_path / "access.json",
            {"keyQuotas": [{"keyId": "noisy", "requestsPerSecond": 30, "burst": 10}]},
        )
        args = (
            *key_args(tmp_path / "keys", tmp_path / "access.json"),
            "--engine",
            "simulated",
            "--simulated-latency",
            f"alpha_ms={ALPHA_MS:g},beta_ms={BETA_MS:g}",
            "--max-batch-size",
            str(MAX_BATCH),
            "--max-queue-delay-ms",
            "2",
            "--deadline-ms",
            f"{SLA_MS:g}",
        )
        with runtime_process(mlp_model, *args, log_dir=tmp_path, env=FAST_POLL) as server:

            def load(key: str, rate: float) -> LoadConfig:
                return LoadConfig(
                    target=Target(
                        url=server.url,
                        model="mlp",
                        timeout_s=5.0,
                        headers={"Authorization": f"Bearer {key}"},
                    ),
                    schedule=RateSchedule.constant(rate),
                    duration_s=4.0,
                    max_send_lag_ms=100.0,
                )

            noisy_report, quiet_report = await asyncio.gather(
                run_load(load(noisy, 1.4 * CAPACITY_RPS)), run_load(load(quiet, 15.0))
            )
            scrape = Scrape(server)
        # the quiet key: every request answered 200, none refused for anyone else's load
        assert quiet_report.errors == {}, quiet_report.errors
        assert quiet_report.succeeded >= 0.9 * 15 * 4, quiet_report.succeeded
        # the noisy key: refused at the gate (429) for most of what it sent, never a 503
        assert set(noisy_report.errors) == {"429"}, noisy_report.errors
        assert noisy_report.errors["429"] > 0.5 * noisy_report.sent, noisy_report.errors
        assert by_key(scrape, "quiet", "over_quota") == 0
        assert by_key(scrape, "noisy", "over_quota") >= noisy_report.errors["429"]
        # the SLA, judged by the server's own histogram (not the client's, on a shared machine)
        assert p99_ms(scrape) <= SLA_MS, p99_ms(scrape)
        assert scrape.value("batchpilot_shed_total") == 0
