"""Bad input, thrown by hypothesis: malformed specs at the form's validator, malformed payloads
straight into the RQ queue of a real worker, and run ids at the exporters.

Every refusal must name the field at fault; the worker must survive every payload and keep
serving; nothing in a payload is unpickled or run unless it is ddpviz's own job function.
"""

from __future__ import annotations

import json
import os
import pickle
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from wmeasure import record
from wtools import TINY, cli_env, ddpviz, wait_for, worker_process

from ddpviz.engine.config import ConfigError, RunConfig, validate_config
from ddpviz.engine.export import export_path
from ddpviz.workers import keys
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.jobs.run import JOB_FUNC
from ddpviz.workers.store import new_run_id

FIELDS = list(RunConfig.model_fields)
SINGLE = {**TINY, "mode": "single", "world_size": 1}
leaf = st.one_of(st.none(), st.booleans(), st.integers(),
                 st.integers(min_value=-2**200, max_value=2**200),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
                 st.integers(min_value=65, max_value=200_000).map(lambda n: "x" * n))
json_value = st.recursive(leaf, lambda c: st.lists(c, max_size=3)
                          | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=6)


def _count(name: str, counter: list[int]) -> None:
    counter[0] += 1
    record(name, counter[0], "payloads")


# -- the validator ------------------------------------------------------------------------------

def test_the_validator_refuses_anything_malformed_naming_the_field():
    refused = []

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=20), json_value, max_size=8))
    def one(spec):
        try:
            validate_config(spec)  # never anything but a RunConfig or a ConfigError
        except ConfigError as exc:
            assert exc.errors
            for field, message in exc.errors:
                assert field and field.split(".")[-1] in message, (field, message)
                assert len(message) < 600  # an oversized value is never echoed whole
            refused.append(1)

    one()
    record("validator_malformed_specs_refused", len(refused), "specs")


def _breaks(field_value: tuple) -> bool:
    try:
        validate_config({**SINGLE, field_value[0]: field_value[1]})
        return False
    except ConfigError:
        return True


def _corruption():
    """(field, bad value) pairs, each breaking exactly that field of a valid spec."""
    return st.one_of(
        st.tuples(st.sampled_from(["world_size", "steps", "width", "seed", "global_batch_size"]),
                  st.one_of(st.text(min_size=1, max_size=10).filter(lambda t: not t.strip().isdigit()),
                            st.integers(min_value=10**7), st.integers(max_value=-1),
                            st.lists(st.integers(), max_size=2), st.none())),
        st.tuples(st.sampled_from(["lr", "bucket_cap_mb", "step_delay_s", "collective_timeout_s"]),
                  st.one_of(st.floats(max_value=0.0), st.floats(min_value=1e6),
                            st.just(float("nan")), st.text(min_size=1, max_size=5)
                            .filter(lambda t: not _is_number(t)))),
        st.tuples(st.sampled_from(["mode", "device", "backend", "dataset", "optimizer", "fault"]),
                  st.text(max_size=50) | st.integers()),
        st.tuples(st.just("model"), st.integers(min_value=65, max_value=10**6).map(lambda n: "m" * n)),
        st.tuples(st.text(min_size=1, max_size=30).filter(lambda k: k not in FIELDS), json_value),
    ).filter(_breaks)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def test_one_broken_field_is_refused_by_name():
    count = []

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_corruption())
    def one(corruption):
        field, value = corruption
        with pytest.raises(ConfigError) as info:
            validate_config({**SINGLE, field: value})
        assert any(f == field and field in m for f, m in info.value.errors), info.value.errors
        count.append(1)

    one()
    record("validator_single_broken_fields_refused", len(count), "specs")


# -- raw payloads straight into the queue ------------------------------------------------------

class Bomb:
    """Unpickling this runs a shell command: a worker that unpickles would leave `MARKER`."""

    marker: str = ""

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _payloads(marker: Path):
    """(kind, field named in the refusal, how to corrupt the job hash or record)."""
    Bomb.marker = str(marker)
    bomb = zlib.compress(pickle.dumps(Bomb()))
    funcs = st.sampled_from(["os.system", "builtins.eval", "subprocess.call", "shutil.rmtree",
                             "ddpviz.workers.jobs.run.run_job", "wjobs.nope"]) | st.text(max_size=40)
    bad_ids = st.one_of(st.integers(), st.floats(), st.none(), st.booleans(),
                        st.lists(st.text(max_size=3), max_size=2),
                        st.text(max_size=300).filter(lambda t: not t.isalnum() or len(t) > 64))
    garbage = st.binary(min_size=1, max_size=200) | st.just(bomb)
    wrong_shape = json_value.filter(lambda v: not (isinstance(v, list) and len(v) == 4))
    bad_config = st.one_of(
        _corruption().map(lambda fv: ({**SINGLE, fv[0]: fv[1]}, fv[0])),
        st.text(max_size=50).map(lambda t: ("{not json " + t, "config")),
        st.sampled_from([[1, 2], 3, "mlp", None]).map(lambda v: (v, "config")))
    return st.one_of(
        st.tuples(st.just("func"), funcs.map(lambda f: {"func": f})),
        st.tuples(st.just("run_id"), bad_ids.map(lambda a: {"args": [a]})),
        st.tuples(st.just("args"), st.lists(st.text(max_size=5), min_size=2, max_size=4)
                  .map(lambda a: {"args": a})),
        st.tuples(st.just("kwargs"), st.dictionaries(st.text(min_size=1, max_size=10), json_value,
                                                     min_size=1, max_size=3)
                  .map(lambda k: {"kwargs": k})),
        st.tuples(st.just("data"), garbage.map(lambda d: {"data": d})),
        st.tuples(st.just("data"), wrong_shape.map(lambda v: {"data": json.dumps(v).encode()})),
        st.sampled_from(["created_at", "timeout", "status", "dependency_ids", "enqueued_at"])
        .flatmap(lambda f: st.text(max_size=20).map(lambda t: (f, {"fields": {f: "garbage:" + t}}))),
        st.tuples(st.just("run_id"), st.just({"args": ["0123456789abcdef"]})),  # no such run
        st.tuples(st.just("config"), bad_config.map(lambda cf: {"config": cf})),
    )


def _enqueue_raw(client: DdpvizClient, payload: dict) -> tuple[str, str]:
    """Store a run record and its RQ job, corrupted as `payload` says, in one transaction (so
    the worker only ever sees the corrupted form). Returns (run id, field to be named)."""
    run_id = new_run_id()
    config, expect = payload.get("config", (SINGLE, None))
    with client.redis.pipeline(transaction=True) as pipe:
        pipe.multi()
        client.store.create(run_id, {}, pipeline=pipe)
        pipe.hset(keys.run(run_id), "config", config if isinstance(config, str) else json.dumps(config))
        client.queue.enqueue(payload.get("func", JOB_FUNC), args=payload.get("args", [run_id]),
                             kwargs=payload.get("kwargs"), job_id=run_id, pipeline=pipe)
        job_key = f"ddpviz:rq:job:{run_id}"
        if "data" in payload:
            pipe.hset(job_key, "data", payload["data"])
        for name, value in payload.get("fields", {}).items():
            pipe.hset(job_key, name, value)
        pipe.execute()
    return run_id, expect


@pytest.mark.slow
def test_malformed_queue_payloads_are_refused_naming_the_field_and_the_worker_serves_on(
        redis_client, redis_url, tmp_path):
    client = DdpvizClient(redis=redis_client)
    marker = tmp_path / "unpickled"
    counts: dict[str, int] = {}
    with worker_process(redis_url, burst=False, name="w-bad", log_path=tmp_path / "w.log") as proc:

        @settings(max_examples=70, deadline=None, suppress_health_check=list(HealthCheck))
        @given(_payloads(marker))
        @example(("data", {"data": zlib.compress(pickle.dumps(Bomb()))}))  # a pickle bomb
        @example(("func", {"func": "os.system", "args": ["touch " + str(marker)]}))
        @example(("status", {"fields": {"status": "garbage:x"}}))
        @example(("timeout", {"fields": {"timeout": "garbage:x"}}))
        @example(("run_id", {"args": ["0123456789abcdef"]}))  # no such run
        @example(("run_id", {"args": ["../../etc/passwd"]}))
        @example(("world_size", {"config": ({**SINGLE, "world_size": 10**30}, "world_size")}))
        @example(("model", {"config": ({**SINGLE, "model": "m" * 100_000}, "model")}))
        def one(kind_payload):
            kind, payload = kind_payload
            run_id, field = _enqueue_raw(client, payload)
            field = field or kind
            rec = wait_for(lambda: (r := client.store.get(run_id))["status"] == "failed" and r, 30,
                           f"the {kind} payload to be refused")
            message = rec["error"]["exception"]
            assert field.split(".")[-1] in message or (kind == "job hash" and "job hash" in message), \
                (kind, payload, message)
            assert proc.poll() is None, (tmp_path / "w.log").read_text()[-3000:]
            counts[kind] = counts.get(kind, 0) + 1

        one()
        assert not marker.exists()  # nothing was unpickled
        good = client.submit(SINGLE)  # and the same worker still runs a real job
        wait_for(lambda: client.get_run(good)["status"] == "succeeded", 90, "a valid run after")
    for kind, n in counts.items():
        record(f"queue_payloads_refused[{kind}]", n, "payloads")
    record("queue_payloads_refused_total", sum(counts.values()), "payloads")


# -- exports never leave their folder -----------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80) | st.sampled_from(["..", "../x", "a/../../b", "/etc/passwd", ".", "",
                                                  "~", "x\x00y", "C:\\x", "a" * 65]))
def test_export_paths_never_leave_their_folder(tmp_path_factory, run_id):
    folder = tmp_path_factory.getbasetemp() / "exports"
    try:
        path = export_path(folder, run_id, ".jsonl")
    except ValueError as exc:
        assert "run_id" in str(exc)
        return
    assert path.parent == folder.resolve() and path.name == f"{run_id}.jsonl"


def test_ddpviz_export_refuses_run_ids_that_could_escape(redis_client, redis_url, tmp_path):
    env = cli_env(redis_url)
    for bad in ("../evil", "a/b", "..", "x" * 65):
        res = ddpviz("export", bad, "--dir", str(tmp_path / "out"), env=env)
        assert res.returncode == 2 and "run_id" in res.stderr, (bad, res.stderr)
    assert not (tmp_path / "evil.jsonl").exists() and not (tmp_path / "out").exists()
    run_id = DdpvizClient(redis=redis_client).submit(SINGLE)
    DdpvizClient(redis=redis_client).cancel(run_id)
    res = ddpviz("export", run_id, "--dir", str(tmp_path / "out"), "--format", "csv", env=env)
    assert res.returncode == 0, res.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == [f"{run_id}.steps.csv"]
