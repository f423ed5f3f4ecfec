"""Every command README.md and docs/*.md show runs as written, on a fresh clone after the README's setup.

How (tests/doc_commands.py takes the commands and snippets from the text; nothing is copied here):

* `fresh_clone`: the repository's files are copied to a new folder and the README's demo command
  runs there exactly as written (a new virtual environment, the install, the demo; the first two
  begin in the background when the session starts, the demo runs after them). That is the
  README's first command's test, and every other command runs "after the README's setup": with
  that `.venv/bin` first on PATH, a fresh HOME, and none of this test session's variables
  (no PYTHONPATH, no RAY_*, no MLFLOW_*).
* A command that runs here runs as written, in a fresh copy of the clone's files, through bash.
  Three are shortened, only through options the docs show: `ray-ormas train` gets
  `--set train.epochs=1` (docs/cli.md), `bench/overhead.py` gets `--models mlp --repeats 1
  --steps 30 --world-sizes 2` and `bench/components/persistence.py` gets `--steps 200
  --uploads 5` (docs/performance.md); a benchmark command runs once per set of options its parser
  makes of it, and a command whose rows a wider documented one prints (the same options, plus
  `--with-report` or a further `--attach` way) is checked by that run; two `ray-ormas train`
  commands that resolve to the same config train once (also when one is a `ray job submit`'s
  entrypoint: the job on the token-authenticated head runs it, and its run is checked for the
  others, `checked_on` below), and an install the README's demo command began with is compared
  with it, not repeated. Each check is the line or
  file the docs promise: the record a training names verifies, a dry run says the config is valid, ...
* A command the text marks as needing what this machine lacks runs the closest thing that does
  (`closest_*` below): a Ray cluster is started here (`ray start --head`; on the
  token-authenticated one, the job's run is also checked as docs/job-submit.md's "What is
  tested" says); a GPU script, or one that needs the test extras, or a benchmark marked
  "not in CI", gets `--help`; a training that needs GPUs or S3 gets `--dry-run`
  with the S3 location made local;
  a read from S3 reads the demo's run through a `file://` URI instead; `kubectl apply -k DIR`
  renders DIR with real kustomize and validates it; other kubectl commands have the objects they
  name looked up in the rendered manifests; docker and kind commands have their Dockerfile and
  images checked.
* A synopsis (placeholders) or a bare mention is checked against the program's `--help`.
* A command no rule covers fails `test_every_command_in_the_docs_has_a_test`: a new command in
  the docs without a test fails the suite.

Every process a test starts runs in its own session and is killed by its process group; Ray
daemons that appear during a command and outlive it are killed by pid, and the test fails.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from ormas_monitor.record import verify_run

from .doc_commands import ROOT, DocCommand, harvest, snippets
from .fresh_clone import Clone, Ran, bash, kill_group

COMMANDS = harvest()
README_DEMO, README_TESTS = [c for c in COMMANDS if c.doc == "README.md" and c.block is not None][:2]
K8S_VARIANTS = [
    "k8s/rayjob",
    "k8s/raycluster",
    "k8s/overlays/s3",
    "k8s/overlays/cpu",
    "k8s/overlays/kueue",
    "k8s/overlays/nccl-tcp",
]
SHORT_TRAIN = " --set train.epochs=1"
SHORT_BENCH = " --models mlp --repeats 1 --steps 30 --world-sizes 2"
SHORT_PERSISTENCE = " --steps 200 --uploads 5"


# ---------------------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------- the clone
def slug(command: DocCommand) -> str:
    return re.sub(r"[^\w]+", "-", command.id)


# ---------------------------------------------------------------------------- runs, cached by text
_runs: dict[str, Ran] = {}


def run_once(key: str, make: Callable[[], Ran]) -> Ran:
    if key not in _runs:
        _runs[key] = make()
    return _runs[key]


def shortened(text: str) -> str:
    text = (
        re.sub(r"(ray-ormas train (?:(?!--dry-run)[^\n])*?)$", lambda m: m.group(1) + SHORT_TRAIN, text, flags=re.M)
        if "--dry-run" not in text and SHORT_TRAIN not in text  # a command already one epoch long stays as it is
        else text
    )
    if "bench/overhead.py" in text:
        text += SHORT_BENCH
    if text == "python bench/components/persistence.py":
        text += SHORT_PERSISTENCE
    return text


def check_quiet_console(out: str) -> None:
    """What a training prints (docs/cli.md, "What the console shows"): no Ray Train line per report,
    no metrics dict, and every ray-ormas and ormas-monitor line once."""
    lines = out.splitlines()
    assert not [x for x in lines if "Reporting training result" in x], "Ray Train's per-report lines are shown"
    ours = [x for x in lines if "[ray-ormas]" in x or "[ormas-monitor]" in x]
    twice = sorted({x for x in ours if ours.count(x) > 1})
    assert not twice, f"lines shown twice: {twice[:5]}"
    assert not [x for x in lines if "'ormas/" in x], "a metrics dict reached the console"


def records_named(out: str) -> list[Path]:
    return [Path(p) for p in re.findall(r"^\s*record: (\S+)$", out, re.M)]


def check_training_output(ran: Ran) -> None:
    assert ran.code == 0, ran.out[-4000:]
    check_quiet_console(ran.out)
    records = records_named(ran.out)
    assert records, "the summary names no record:\n" + ran.out[-3000:]
    for record in records:
        report = verify_run(record)
        assert report.ok, (record, report)
        assert (record / "report.html").is_file()
    pages = re.findall(r"^run page: (\S+)$", ran.out, re.M)  # the run on one page, in the record
    assert pages and all(Path(p).is_file() for p in pages if "://" not in p), ran.out[-3000:]


def bench_options(text: str) -> dict[str, Any] | None:
    """The options `bench/overhead.py`'s own parser makes of a command (None: not that benchmark)."""
    bench = re.fullmatch(r"python bench/overhead\.py(.*)", text)
    if bench is None:
        return None
    from bench.overhead import parser

    return vars(parser().parse_args(shlex.split(bench.group(1))))


def covers(wider: dict[str, Any], narrower: dict[str, Any]) -> bool:
    """A benchmark run with `wider` options prints every row one with `narrower` options prints:
    the same options, except that it may add `--with-report`'s configuration to the table, or
    further ways of attaching to the paired runs (the rows of one run do not depend on each other)."""
    same = {k: v for k, v in wider.items() if k not in ("with_report", "attach")}
    return (
        same == {k: v for k, v in narrower.items() if k not in ("with_report", "attach")}
        and wider["with_report"] >= narrower["with_report"]
        and wider["attach"][: len(narrower["attach"])] == narrower["attach"]
    )


def widest_run(text: str) -> str:
    """The command to run for `text`: for the benchmark, the widest of the docs' (shortened)
    benchmark commands that covers it, so two commands whose runs would repeat each other's rows
    run once (performance.md's table with and without `--with-report`; the paired runs with one
    way of attaching and with both)."""
    options = bench_options(text)
    if options is None:
        return text
    shown = [shortened(c.text) for c in COMMANDS if plan(c) == "run" and bench_options(shortened(c.text))]
    wider = [t for t in shown if covers(bench_options(t) or {}, options)]
    return max(wider, key=lambda t: (bench_options(t) or {})["with_report"] + len((bench_options(t) or {})["attach"]))


def trained_config(text: str) -> str | None:
    """The config a `ray-ormas train CONFIG.yaml [--set ...]` command trains, resolved as the
    command resolves it (its YAML, its overrides, validated): two commands that train the same
    config train once. None: not such a command (or a dry run, or one the parser refuses)."""
    match = re.fullmatch(r"ray-ormas train (\S+\.yaml)((?: --set \S+)*)", text)
    if match is None:
        return None
    from ray_ormas._internal.common.job_config import load_config

    overrides = re.findall(r"--set (\S+)", match.group(2))
    return load_config(ROOT / match.group(1), overrides).model_dump_json()


def run_key(text: str) -> str:
    """What tells one run from another: the text; for a training, the config it resolves to (the
    docs give the repaired digits run both as `digits_repair.yaml` and as `digits_watch.yaml`
    with `monitor.repair=true` and its name); for the benchmark, the options its own parser makes
    of it (later options win, so the docs' command shortened is often another's)."""
    config = trained_config(text)
    if config is not None:
        return f"ray-ormas train {config}"
    options = bench_options(text)
    return text if options is None else f"bench/overhead.py {sorted(options.items())}"


def run_here(clone: Clone, command: DocCommand) -> Ran:
    """A runnable command, as written (shortened as the docs allow; for the benchmark, the widest
    documented run that covers it), in a fresh copy."""
    text = widest_run(shortened(command.text))

    def make() -> Ran:
        work = clone.copy(slug(command))
        return bash(text, cwd=work, env=clone.env(work / "home"), timeout=900)

    return run_once(run_key(text), make)


# ---------------------------------------------------------------------------- closest things
class RayHead:
    """A Ray head node started here with `ray start --head`, in its own session and temp dir,
    with token authentication when asked (RAY_AUTH_MODE=token and a random token, in the head's
    environment only); stopped by its process group, after the last command that runs on it (an
    idle head's daemons take CPU the later commands need), and at the latest with the module."""

    def __init__(self, clone: Clone, *, token: bool = False) -> None:
        name = "head-token" if token else "head"
        self.stopped = False
        self.home = clone.base / f"home-{name}"
        self.env = clone.env(self.home)
        self.token = secrets.token_hex(32) if token else ""
        head_env = {**self.env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token} if token else self.env
        self.temp_dir = Path("/tmp") / f"rod-{name}-{os.getpid()}"
        self.port = free_port()
        ray = str(clone.root / ".venv" / "bin" / "ray")
        self.log = clone.base / f"{name}.log"
        self.proc = subprocess.Popen(
            [
                ray,
                "start",
                "--head",
                "--block",
                f"--port={free_port()}",
                "--node-ip-address=127.0.0.1",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.port}",
                "--include-dashboard=true",
                f"--ray-client-server-port={free_port()}",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--dashboard-agent-grpc-port={free_port()}",
                f"--runtime-env-agent-port={free_port()}",
                f"--metrics-export-port={free_port()}",
                "--num-cpus=2",
                f"--temp-dir={self.temp_dir}",
                "--disable-usage-stats",
            ],
            env=head_env,
            stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.address = f"http://127.0.0.1:{self.port}"
        # Ready when a job runs: the job server answers before the head's job agent has registered,
        # and a submission then fails with "No available agent to submit job, please try again later".
        ready = [ray, "job", "submit", "--address", self.address, "--", "true"]
        deadline = time.monotonic() + 180
        while subprocess.run(ready, env=head_env, capture_output=True, timeout=120).returncode != 0:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the head did not run a job within 180 s of its start"
            time.sleep(2)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):  # `ray start --block` lingers on SIGTERM
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        subprocess.run(["pkill", "-9", "-f", str(self.temp_dir)], check=False)  # the job's driver, Ray's daemons
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_head(clone):
    head = RayHead(clone)
    yield head
    head.stop()


@pytest.fixture(scope="module")
def ray_head_with_token(clone):
    head = RayHead(clone, token=True)
    yield head
    head.stop()


def head_fixture(command: DocCommand) -> str:
    """The head a cluster command runs on: with token authentication when the text says so."""
    return "ray_head_with_token" if "token" in (command.needs or "") else "ray_head"


def block_training(command: DocCommand) -> str | None:
    """The config that the `ray job submit ... -- ray-ormas train` of `command`'s block trains
    (resolved, and shortened as it runs here), or None."""
    for c in COMMANDS:
        if command.block is not None and c.block == command.block and "-- ray-ormas train " in c.text:
            return trained_config(shortened(c.text[c.text.index("ray-ormas train ") :]))
    return None


def checked_on(command: DocCommand) -> DocCommand:
    """The cluster command whose run checks `command`. Two commands that train the same config
    train once: a `ray-ormas train`, or a job on a head without a token, whose training the job
    on the token-authenticated head runs word for word is checked on that job's run (the same
    `ray-ormas train` process on a cluster's node; submitting through `RAY_ADDRESS` is still run,
    by docs/cli.md's GAN job). Otherwise the command itself."""
    how = plan(command)
    key = trained_config(shortened(command.text)) if how == "train" else None
    if how == "ray_cluster" and head_fixture(command) == "ray_head":
        key = block_training(command)
    if key is None:
        return command
    jobs = [c for c in COMMANDS if plan(c) == "ray_cluster" and head_fixture(c) == "ray_head_with_token"]
    return next((job for job in jobs if "-- ray-ormas train " in job.text and block_training(job) == key), command)


def head_of_the_run(command: DocCommand) -> str | None:
    """The head that the run checking `command` runs on (a fixture's name), or None."""
    target = checked_on(command)
    return head_fixture(target) if plan(target) == "ray_cluster" else None


def last_on_its_head(command: DocCommand) -> bool:
    """Whether no later command of the docs is checked by a run on the same head."""
    same = [c for c in COMMANDS if head_of_the_run(c) == head_of_the_run(command)]
    return command == same[-1]


def run_on_its_head(clone: Clone, command: DocCommand, request: pytest.FixtureRequest) -> Ran:
    """The run that checks `command`, on its head (once per block: later commands read it); the
    token-authenticated job's own checks with the last command on that head, which then stops."""
    target = checked_on(command)
    head = request.getfixturevalue(head_fixture(target))
    try:
        ran = closest_on_a_ray_cluster(clone, target, head)
        if head.token and last_on_its_head(command):
            check_the_job_on_a_token_head(clone, head, ran)
    finally:
        if last_on_its_head(command):
            head.stop()
    return ran


def closest_on_a_ray_cluster(clone: Clone, command: DocCommand, head: RayHead) -> Ran:
    """The whole block as written, against a head started here: HEAD:8265 is that head's
    dashboard, RAY_ADDRESS is set when the text says it is, token.txt holds its token."""
    assert command.block is not None
    assert not head.stopped, f"{command.id} comes after the last command planned on its head"
    lines = [c.text for c in COMMANDS if c.block == command.block]
    script = "\n".join(shortened(line) for line in lines).replace("HEAD:8265", f"127.0.0.1:{head.port}")
    assert not command.has_placeholder() or "HEAD" in command.text, command.text

    def make() -> Ran:
        work = clone.copy(slug(command))
        (work / "token.txt").write_text(head.token)
        env = dict(head.env)
        if "RAY_ADDRESS" in (command.needs or ""):
            env["RAY_ADDRESS"] = head.address
        return bash("set -e\n" + script, cwd=work, env=env, timeout=900)

    ran = run_once(script, make)
    check_training_output(ran)
    if "examples/gan.yaml" in script:  # one monitor, and one verified record, per model
        assert "monitor 'generator'" in ran.out and "monitor 'discriminator'" in ran.out, ran.out[-3000:]
        assert {r.parts[-2] for r in records_named(ran.out)} == {"generator", "discriminator"}, ran.out[-3000:]
        for record in records_named(ran.out):  # both models under DDP, each with its own monitor
            manifest = next(
                e
                for e in map(json.loads, (record / "diary.jsonl").read_text().splitlines())
                if e["event"] == "manifest"
            )
            assert manifest["distributed"]["mode"] == "ddp" and manifest["distributed"]["world_size"] == 2, manifest
    return ran


WATCH_EXAMPLE = "ray-ormas train examples/digits_watch.yaml"


def check_the_watch_example(out: str) -> None:
    """examples/digits_watch.yaml as its comment promises, on docs/cli.md's run of it (one epoch):
    the 96 dead channels certified at the first check, left dead, and said in the summary; the
    example's repair is checked on tests/test_train_command.py's run of digits_repair.yaml."""
    assert "monitor 'model': 7 layers, 5 healthy" in out, out[-3000:]
    assert "conv2.0       0         32         0            32  certified dead" in out, out[-3000:]
    assert "conv3.0       0         64         0            64  certified dead" in out, out[-3000:]


def check_the_job_on_a_token_head(clone: Clone, head: RayHead, ran: Ran) -> None:
    """docs/job-submit.md's "What is tested", on the run of its token-authenticated block: a wrong
    token is refused; the job's output has the connection line, progress lines and the summary
    table; the record in storage verifies; the MLflow run is FINISHED with the config's params;
    and a relative storage path is refused on the driver (exit 2, the job FAILED, nothing trained)."""
    ray = str(clone.root / ".venv" / "bin" / "ray")
    token_env = {**head.env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": head.token}
    wrong = subprocess.run(
        [ray, "job", "list", "--address", head.address],
        env={**token_env, "RAY_AUTH_TOKEN": secrets.token_hex(32)},
        capture_output=True,
        timeout=120,
    )
    assert wrong.returncode != 0, "a wrong token was accepted"

    assert "connecting to the Ray cluster at" in ran.out, ran.out[-3000:]
    assert "[ray-ormas] model step      0" in ran.out and "repaired   96 ch" in ran.out, ran.out[-3000:]  # progress
    assert "conv2.0       0         32        32             0  repaired" in ran.out, ran.out[-3000:]  # the summary
    (record,) = [r for r in records_named(ran.out) if r.parts[-3:-1] == ("ormas", "model")]
    run_dir = record.parents[2]  # RUN/ormas/model/segment-000
    assert run_dir.name == "digits-repair" and verify_run(record).ok
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs(client.get_experiment_by_name("ray-ormas").experiment_id)
    assert run.info.status == "FINISHED" and run.data.params["monitor.repair"] == "True"
    assert run.data.params["train_loop_config.train.epochs"] == SHORT_TRAIN.split("=")[-1]

    # A relative storage path would live in the job's temporary working directory: refused.
    work = clone.copy("job-relative-storage")
    relative = subprocess.run(
        [ray, "job", "submit", "--address", head.address, "--working-dir", ".", "--"]
        + ["ray-ormas", "train", "examples/digits_repair.yaml", "--set", "storage.path=./runs"],
        cwd=work,
        env=token_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = relative.stdout + relative.stderr
    assert relative.returncode != 0, said[-3000:]
    assert "storage.path: './runs' is a relative path, and this runs under `ray job submit`" in said, said[-3000:]
    assert "exit code 2" in said or "failed" in said.lower()


def closest_dry_run(clone: Clone, command: DocCommand) -> None:
    """A training that needs GPUs, S3 or Kubernetes: the same `ray-ormas train`, S3 and cluster
    locations made local, with `--dry-run` (everything but the training)."""
    inner = command.text[command.text.index("ray-ormas train") :]
    work = clone.copy(slug(command))
    storage = work / "storage"
    storage.mkdir()
    if "/etc/ray-ormas/config.yaml" in inner:  # the ConfigMap's file, as the pod mounts it
        (config_map,) = [o for o in rendered("k8s/raycluster") if o["kind"] == "ConfigMap"]
        ((name, body),) = config_map["data"].items()
        (work / name).write_text(body)
        inner = inner.replace("/etc/ray-ormas/config.yaml", name)
    inner = re.sub(r"s3://\S+", str(storage), inner).replace("/mnt/ray-runs", str(storage))
    ran = bash(inner + " --dry-run", cwd=work, env=clone.env(work / "home"), timeout=300)
    assert ran.code == 0 and "config is valid" in ran.out, ran.out[-3000:]


def closest_s3_read(clone: Clone, command: DocCommand) -> None:
    """`ray-ormas report|export s3://...`: the demo's run, through a file:// URI instead."""
    run = clone.root / "ray_ormas_demo" / "digits-repair"
    assert run.is_dir(), "the README's demo wrote no digits-repair run"
    text = re.sub(r"s3://\S+", f"file://{run}", command.text)
    work = clone.copy(slug(command))
    ran = bash(text, cwd=work, env=clone.env(work / "home"), timeout=300)
    assert ran.code == 0, ran.out[-3000:]
    out = work / command.words[command.words.index("--out") + 1]
    wanted = "report.html" if command.words[1] == "report" else "metrics.parquet"
    assert list(out.rglob(wanted)), (wanted, sorted(out.rglob("*")))


def closest_help(clone: Clone, command: DocCommand) -> None:
    """A synopsis, a mention, or a script that needs a GPU or the test extras: its `--help` runs, and names every
    option the text shows."""
    words = [w for w in command.words if not w.startswith("[")]
    prefix = []
    for w in words:
        if w.startswith("-") or w in ("...", "|") or re.search(r"[A-Z<./]", w) and prefix and not w.endswith(".py"):
            break
        prefix.append(w)
    options = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", command.text)) - {"--help"}
    script = shlex.join(prefix) + " --help"
    ran = run_once(script, lambda: bash(script, cwd=clone.root, env=clone.env(clone.base / "home-help"), timeout=120))
    assert ran.code == 0, ran.out[-2000:]
    missing = [o for o in options if o not in ran.out]
    assert not missing, f"{' '.join(prefix)} --help does not know {missing}"


def rendered(variant: str) -> list[dict[str, Any]]:
    from .test_k8s import render

    return render(ROOT / variant)


def validate(objects: list[dict[str, Any]]) -> None:
    import kubernetes_validate

    from .test_k8s import KUBERNETES_VERSION, validation_errors

    for obj in objects:
        if obj["apiVersion"] == "ray.io/v1":
            errors = validation_errors(obj)
            assert not errors, errors[:5]
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def named(kind: str, name: str) -> list[dict[str, Any]]:
    return [o for v in K8S_VARIANTS for o in rendered(v) if o["kind"] == kind and o["metadata"]["name"] == name]


def closest_kubernetes(clone: Clone, command: DocCommand) -> None:
    """kubectl, helm and kind without a cluster: render and validate what `apply -k` would
    apply; look up the objects the other commands name; check the images they load."""
    text, words = command.text, command.words
    secret = re.search(r"kubectl get secret (?:-n \S+ )?(\S+)", text)
    if secret:  # KubeRay's token Secret, named after the RayCluster
        name = secret.group(1)
        clusters = named("RayCluster", name)
        assert clusters and all(c["spec"]["authOptions"]["mode"] == "token" for c in clusters), name
    elif words[0] == "helm":  # the operator's CRDs are what the manifests must fit
        validate(rendered("k8s/rayjob"))
    elif words[0] == "kind":
        image = words[-1].replace("REGISTRY/", "")
        assert any(image in yaml.safe_dump(list(rendered(v))) for v in K8S_VARIANTS) or image.replace(
            "-cpu", "-gpu"
        ) in yaml.safe_dump(list(rendered("k8s/overlays/cpu"))), image
        assert "-cpu" in image and "-cpu" in yaml.safe_dump(list(rendered("k8s/overlays/cpu"))), image
    elif words[1:3] == ["apply", "-k"] and len(words) > 3 and (ROOT / words[3]).is_dir():
        validate(rendered(words[3]))
    elif words[1] == "kustomize":
        for variant in K8S_VARIANTS:
            validate(rendered(variant))
    elif words[1:3] == ["create", "namespace"]:
        ran = bash(text + " --dry-run=client -o yaml", cwd=clone.root, env=clone.env(clone.base / "home-k"), timeout=60)
        assert ran.code == 0 and "kind: Namespace" in ran.out, ran.out
    elif words[1] == "get" and len(words) > 3 and not words[3].startswith("-"):
        assert named({"rayjob": "RayJob", "raycluster": "RayCluster"}[words[2]], words[3]), text
    elif words[1] == "logs" and "job-name=" in text:  # KubeRay names the submitter Job after the RayJob
        assert named("RayJob", re.search(r"job-name=(\S+)", text).group(1)), text
    elif words[1] == "port-forward":
        service, (_local, remote) = words[2].removeprefix("svc/"), words[3].split(":")
        if service.endswith("-head-svc"):  # KubeRay's head Service of a RayCluster
            assert named("RayCluster", service.removesuffix("-head-svc")) and remote == "8265", text
        else:
            ports = [p["port"] for s in named("Service", service) for p in s["spec"]["ports"]]
            assert int(remote) in ports, (service, ports)
    else:  # no object named: the syntax is kubectl's
        ran = bash(shlex.join(words[:2]) + " --help", cwd=clone.root, env=clone.env(clone.base / "home-k"), timeout=60)
        assert ran.code == 0, ran.out


def closest_docker(clone: Clone, command: DocCommand) -> None:
    """docker build: the Dockerfile, its build arguments and copied files; docker push: the
    image is one the manifests pull."""
    words = command.words
    image = words[words.index("-t") + 1] if "-t" in words else words[-1]
    manifests = yaml.safe_dump([o for v in K8S_VARIANTS for o in rendered(v)])
    variant = image.rsplit("-", 1)[-1]
    assert image in manifests or variant == "cpu", (image, "is pulled by no manifest")
    if words[1] != "build":
        return
    dockerfile = (ROOT / words[words.index("-f") + 1]).read_text()
    declared = set(re.findall(r"^ARG (\w+)", dockerfile, re.M))
    for arg in (words[i + 1].split("=")[0] for i, w in enumerate(words) if w == "--build-arg"):
        assert arg in declared, (arg, declared)
    for sources in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", dockerfile, re.M):
        for source in sources.split():
            assert (ROOT / words[-1] / source).exists(), source
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    ray_version = re.search(r"rayproject/ray:([\d.]+)-", dockerfile).group(1)
    assert f"ray-ormas:{version}-ray{ray_version}-" in image, (image, version, ray_version)


def closest_server(clone: Clone, command: DocCommand) -> None:
    """`mlflow ui ...` in the clone, after the README's demo: it answers on 127.0.0.1:5000."""
    proc = subprocess.Popen(
        ["bash", "-c", command.text],
        cwd=clone.root,
        env=clone.env(clone.base / "home-ui"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "the server exited"
            try:
                with urllib.request.urlopen(
                    "http://127.0.0.1:5000/api/2.0/mlflow/experiments/search?max_results=10", timeout=5
                ) as r:
                    assert r.status == 200 and b"ray-ormas" in r.read()
                    return
            except OSError:
                assert time.monotonic() < deadline, "the server did not answer in 120 s"
                time.sleep(2)
    finally:
        kill_group(proc)
        proc.wait(timeout=30)


def after_demo(clone: Clone, command: DocCommand) -> None:
    """A command on the README demo's output, as written, in the clone where the demo ran: the
    demo's MLflow runs are complete, so `mlflow-sync` sends nothing; `goodput` prints the run's
    account (one fit, no restart)."""
    ran = bash(command.text, cwd=clone.root, env=clone.env(clone.base / "home-after"), timeout=300)
    if command.text.startswith("ray-ormas goodput"):
        assert ran.code == 0 and re.search(r"fit 1 of 1: goodput \d+% of ", ran.out), ran.out[-3000:]
        assert "productive" in ran.out and "restart after" not in ran.out, ran.out[-3000:]
        return
    assert ran.code == 0 and "0 metric values and 0 files sent" in ran.out, ran.out[-3000:]


CLOSEST: dict[str, Callable[[Clone, DocCommand], None]] = {
    "dry_run": closest_dry_run,
    "s3_read": closest_s3_read,
    "help": closest_help,
    "kubernetes": closest_kubernetes,
    "docker": closest_docker,
    "server": closest_server,
    "after_demo": after_demo,
}


# ---------------------------------------------------------------------------- the plan
def plan(command: DocCommand) -> str:
    """How a command is tested (the name of a check below), or "" when no rule covers it."""
    needs, text, program = (command.needs or ""), command.text, command.program
    if command == README_DEMO:
        return "readme_demo"
    if command == README_TESTS:
        return "readme_tests"
    if program in ("kubectl", "helm", "kind") or "$(kubectl" in text:
        return "kubernetes" if needs else ""
    if program == "docker":
        return "docker" if needs else ""
    if needs:
        if "Ray cluster" in needs and not re.search("GPU|S3", needs) and command.block is not None:
            return "ray_cluster"
        if (
            "ray-ormas train" in text
            and not command.has_placeholder()
            or "ray-ormas train" in text
            and re.search("GPU|S3|Kubernetes", needs)
            and "s3://BUCKET" in text
        ):
            return "dry_run"
        if re.match(r"ray-ormas (report|export) s3://", text):
            return "s3_read"
        if ("GPU" in needs or "test extras" in needs or "not in CI" in needs) and program.startswith("python"):
            return "help"
        if command.has_placeholder():
            return "help"
        return ""
    if command.has_placeholder() or command.is_mention():
        return "help"
    if text == "ray-ormas demo":
        return "demo"
    if text.startswith(("python3.11 -m venv", "pip install")):
        return "install"
    if re.match(r"mlflow (ui|server)\b", text):
        return "server"
    if re.match(r"ray-ormas (mlflow-sync|goodput) ray_ormas_demo/", text):
        return "after_demo"
    if text.startswith("ray-ormas train"):
        return "train"
    return "run"


def test_every_command_in_the_docs_has_a_test():
    unplanned = [f"{c.id}: {c.text}" + (f"  (needs: {c.needs})" if c.needs else "") for c in COMMANDS if not plan(c)]
    assert not unplanned, "commands in the docs with no test (mark what they need, or add a rule):\n" + "\n".join(
        unplanned
    )
    assert README_DEMO.text.endswith("ray-ormas demo") and README_TESTS.text.endswith("python -m pytest")
    assert {plan(c) for c in COMMANDS} >= {
        "train",
        "help",
        "kubernetes",
        "docker",
        "ray_cluster",
        "dry_run",
        "s3_read",
        "server",
        "run",
        "install",
    }


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_the_command_runs_as_the_docs_say(command: DocCommand, clone: Clone, request):
    how = plan(command)
    assert clone.demo is not None and clone.demo.code == 0, (
        "the README's demo command failed on a fresh clone:\n" + clone.demo.out[-4000:]
    )
    if how == "readme_demo":
        assert "test acc" in clone.demo.out and "repair" in clone.demo.out, clone.demo.out[-3000:]
    elif how == "readme_tests":  # CI runs it, word for word (tests/test_readme.py)
        ci = (ROOT / ".ci" / "run").read_text().splitlines()
        assert command.text in ci
    elif how == "demo":  # the same command as the README's, in the same setup
        assert README_DEMO.text.endswith("&& .venv/bin/" + command.text)
    elif how == "install" and README_DEMO.text.startswith(command.text + " && "):
        # The README's demo command began with this very install, on this clone: compared, not repeated.
        assert (clone.root / ".venv" / "bin" / "ray-ormas").is_file()
    elif how == "install":
        ran = run_once(
            command.text, lambda: bash(command.text, cwd=clone.root, env=clone.env(clone.base / "home-i"), timeout=900)
        )
        assert ran.code == 0, ran.out[-3000:]
    elif how == "train":
        if checked_on(command) is not command:  # a job of the docs runs this very training
            ran = run_on_its_head(clone, command, request)
        else:
            ran = run_here(clone, command)
        if "--dry-run" in command.text:
            assert ran.code == 0 and "config is valid" in ran.out, ran.out[-3000:]
        else:
            check_training_output(ran)
        if trained_config(shortened(command.text)) == trained_config(shortened(WATCH_EXAMPLE)):
            check_the_watch_example(ran.out)
    elif how == "run":
        ran = run_here(clone, command)
        assert ran.code == 0, ran.out[-3000:]
        if command.text == "python -m ray_ormas._internal.common.job_config":
            assert ran.out.strip() in (ROOT / "docs" / "cli.md").read_text()
        if command.program == "grep":
            assert ran.out.strip(), "grep found nothing"

    elif how == "ray_cluster":
        run_on_its_head(clone, command, request)
    elif how in CLOSEST:
        CLOSEST[how](clone, command)
    else:
        pytest.fail(f"no test for {command.id}: {command.text}")


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("snippet", snippets(), ids=[s.id for s in snippets()])
def test_the_python_snippets_run_as_written(snippet, clone: Clone):
    if snippet.install is not None:  # the extra the snippet says it needs, as the docs say to install it
        installed = run_once(
            snippet.install,
            lambda: bash(snippet.install, cwd=clone.root, env=clone.env(clone.base / "home-i"), timeout=900),
        )
        assert installed.code == 0, installed.out[-3000:]
    work = clone.copy(re.sub(r"[^\w]+", "-", snippet.id))
    (work / "snippet.py").write_text(snippet.code)
    home = work / "home"
    ran = bash("python snippet.py", cwd=work, env=clone.env(home), timeout=900)
    assert ran.code == 0, ran.out[-4000:]
    segments = [
        p
        for p in (*home.glob("ray_results/*/ormas/model/segment-*"), *work.glob("runs/*/ormas/model/segment-*"))
        if p.is_dir()
    ]
    assert segments, "the snippet's run left no record where the docs say"
    for segment in segments:
        assert verify_run(segment).ok, segment
