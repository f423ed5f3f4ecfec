"""The KubeRay manifests in k8s/: every variant is rendered by real kustomize (`kubectl
kustomize`, as `kubectl apply -k` renders it); every RayJob and RayCluster validates against the
KubeRay CRD schemas with unknown fields rejected and their CEL rules (`x-kubernetes-validations`)
evaluated, every core object against Kubernetes' own schemas (kubernetes-validate, strict); the
policies hold (token auth, pinned images, no hostPath, non-root, GPU worker group, the operator's
rules for deletion rules and suspended jobs); and the RayJob's entrypoint with the ConfigMap's
config runs for real against the session's local Ray cluster (CPU)."""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import cel
import jsonschema
import kubernetes_validate
import pytest
import yaml
from ormas_monitor.record import verify_run

from ray_ormas import open_records

from .conftest import ROOT

K8S = ROOT / "k8s"
CRDS = ROOT / "tests" / "data" / "kuberay-crds"
VARIANTS = [
    "rayjob",
    "raycluster",
    "overlays/s3",
    "overlays/cpu",
    "overlays/kueue",
    "overlays/nccl-tcp",
    "overlays/diagnose",
]
GPU_VARIANTS = ["rayjob", "raycluster", "overlays/s3", "overlays/kueue", "overlays/nccl-tcp", "overlays/diagnose"]
PY_SPY_DIR = "/opt/ray-ormas-py-spy"  # k8s/components/diagnose
KUBERNETES_VERSION = "1.33.0"
RAY_VERSION = "2.60.0"


@functools.lru_cache(maxsize=None)
def _rendered(directory: str) -> str:
    done = subprocess.run(["kubectl", "kustomize", directory], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"kubectl kustomize {directory}: {done.stderr}"
    return done.stdout


def render(directory: Path) -> list[dict[str, Any]]:
    """What `kubectl apply -k DIRECTORY` would apply, rendered by kubectl's own kustomize (a
    fresh copy on every call: tests may change it)."""
    return [o for o in yaml.safe_load_all(_rendered(str(directory))) if o]


@functools.lru_cache(maxsize=None)
def crd_version_schema(kind: str) -> dict[str, Any]:
    """The CRD's v1 openAPIV3Schema, as KubeRay ships it."""
    path = CRDS / {"RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml"}[kind]
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


@functools.lru_cache(maxsize=None)
def crd_schema(kind: str) -> dict[str, Any]:
    """The CRD's schema as a JSON schema that rejects unknown fields (like the API server's
    strict field validation)."""
    return strict(copy.deepcopy(crd_version_schema(kind)))


def strict(node: Any) -> Any:
    if isinstance(node, dict):
        if node.pop("x-kubernetes-int-or-string", False):
            node.pop("type", None)
            node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for value in node.values():
            strict(value)
    elif isinstance(node, list):
        for value in node:
            strict(value)
    return node


def cel_violations(schema: dict[str, Any], node: Any, path: str = "") -> list[str]:
    """The messages of the CRD's CEL rules (`x-kubernetes-validations`) that `node` breaks, as
    the API server evaluates them on create: every rule where its field is present; transition
    rules (those that read `oldSelf`) only apply to updates and are skipped."""
    broken = [
        f"{path or '.'}: {rule['message']}"
        for rule in schema.get("x-kubernetes-validations", [])
        if "oldSelf" not in rule["rule"] and cel.evaluate(rule["rule"], {"self": node}) is not True
    ]
    if isinstance(node, dict):
        extra = schema.get("additionalProperties")
        for key, value in node.items():
            child = schema.get("properties", {}).get(key, extra if isinstance(extra, dict) else None)
            if child is not None:
                broken += cel_violations(child, value, f"{path}.{key}")
    elif isinstance(node, list) and "items" in schema:
        for i, value in enumerate(node):
            broken += cel_violations(schema["items"], value, f"{path}[{i}]")
    return broken


def validation_errors(obj: dict[str, Any]) -> list[str]:
    """What the API server would refuse in a KubeRay object: schema errors (unknown fields
    included) and broken CEL rules."""
    errors = sorted(jsonschema.Draft7Validator(crd_schema(obj["kind"])).iter_errors(obj), key=str)
    return [f"{list(e.path)}: {e.message}" for e in errors] + cel_violations(crd_version_schema(obj["kind"]), obj)


def pod_specs(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = obj["spec"]
    if obj["kind"] == "RayJob":
        spec = spec["rayClusterSpec"]
    if obj["kind"] in ("RayJob", "RayCluster"):
        yield spec["headGroupSpec"]["template"]["spec"]
        for group in spec["workerGroupSpecs"]:
            yield group["template"]["spec"]
    elif obj["kind"] == "Deployment":
        yield spec["template"]["spec"]


def cluster_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["rayClusterSpec"] if obj["kind"] == "RayJob" else obj["spec"]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_validates_strictly(variant):
    objects = render(K8S / variant)
    ray_objects = [o for o in objects if o["kind"] in ("RayJob", "RayCluster")]
    assert len(ray_objects) == 1
    for obj in objects:
        if obj["apiVersion"] == "ray.io/v1":
            errors = validation_errors(obj)
            assert not errors, f"{obj['kind']}: " + "; ".join(errors[:5])
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_crd_check_rejects_an_unknown_field():
    (rayjob,) = by_kind(render(K8S / "rayjob"), "RayJob")
    rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParam"] = {}  # a typo
    errors = list(jsonschema.Draft7Validator(crd_schema("RayJob")).iter_errors(rayjob))
    assert any("rayStartParam" in e.message for e in errors)
    # The CEL rules: legacy policies beside deletion rules, and a condition with both statuses.
    strategy = rayjob["spec"]["deletionStrategy"]
    strategy["onSuccess"] = {"policy": "DeleteCluster"}
    strategy["deletionRules"][0]["condition"]["jobDeploymentStatus"] = "Failed"
    errors = cel_violations(crd_version_schema("RayJob"), rayjob)
    assert any(
        ".spec.deletionStrategy: legacy policies (onSuccess/onFailure) and deletionRules" in e for e in errors
    ), errors
    assert any(
        ".spec.deletionStrategy.deletionRules[0].condition: JobStatus and JobDeploymentStatus" in e for e in errors
    ), errors
    deployment = copy.deepcopy(by_kind(render(K8S / "rayjob"), "Deployment")[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_policies_hold_in_every_variant(variant):
    objects = render(K8S / variant)
    text = json.dumps(objects)
    assert "hostPath" not in text and '"privileged": true' not in text
    (ray,) = [o for o in objects if o["kind"] in ("RayJob", "RayCluster")]
    spec = cluster_spec(ray)
    assert spec["rayVersion"] == RAY_VERSION and spec["authOptions"] == {"mode": "token"}
    for pod in pod_specs(ray):
        assert pod["securityContext"]["runAsNonRoot"] is True
        for c in pod["containers"] + pod.get("initContainers", []):
            assert c["image"].endswith(f"-ray{RAY_VERSION}-gpu") or c["image"].endswith(f"-ray{RAY_VERSION}-cpu")
            if c["securityContext"]["allowPrivilegeEscalation"] is not False:  # the diagnose component's only
                assert variant == "overlays/diagnose" and c["securityContext"]["capabilities"]["add"] == ["SYS_PTRACE"]
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    (mlflow,) = by_kind(objects, "Deployment")
    (pod,) = pod_specs(mlflow)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["image"] == "ghcr.io/mlflow/mlflow:v3.17.2"
    assert {e["secretRef"]["name"] for e in pod["containers"][0]["envFrom"]} == {"ray-ormas-mlflow"}
    assert {o["kind"] for o in objects if o["metadata"]["name"] == "ray-ormas-mlflow"} == {
        "Deployment",
        "Service",
        "PersistentVolumeClaim",
        "Secret",
    }
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in head["env"]}
    assert env["MLFLOW_TRACKING_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "ray-ormas-mlflow"
    assert env["MLFLOW_TRACKING_URI"]["value"] == "http://ray-ormas-mlflow:5000"


@pytest.mark.parametrize("variant", GPU_VARIANTS)
def test_the_gpu_worker_group(variant):
    (ray,) = [o for o in render(K8S / variant) if o["kind"] in ("RayJob", "RayCluster")]
    (group,) = cluster_spec(ray)["workerGroupSpecs"]
    pod = group["template"]["spec"]
    worker = pod["containers"][0]
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"]
    shm = {v["name"]: v for v in pod["volumes"]}["shm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in worker["volumeMounts"]
    nccl = {e["name"]: e["value"] for e in worker["env"] if e["name"].startswith("NCCL_")}
    if variant == "overlays/nccl-tcp":  # TCP pinned on request only
        assert nccl == {"NCCL_DEBUG": "WARN", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"}
    else:  # NCCL picks InfiniBand/RoCE where the pods have it
        assert nccl == {"NCCL_DEBUG": "WARN"}
    assert not [e["name"] for e in worker["env"] if e["name"].startswith("MLFLOW_")]  # only the head talks to MLflow
    assert "ray-ormas-mlflow" not in str(worker)
    assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


@pytest.mark.parametrize("variant", ["overlays/diagnose", "raycluster+diagnose"])
def test_the_diagnose_component_grants_ptrace_to_py_spy_on_the_workers_only(variant, tmp_path):
    if variant == "raycluster+diagnose":  # the component added to one's own kustomization
        (tmp_path / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [os.path.relpath(K8S / "raycluster", tmp_path)],
                    "components": [os.path.relpath(K8S / "components" / "diagnose", tmp_path)],
                }
            )
        )
    objects = render(tmp_path if variant == "raycluster+diagnose" else K8S / variant)
    (ray,) = [o for o in objects if o["kind"] in ("RayJob", "RayCluster")]
    assert validation_errors(ray) == []
    spec = cluster_spec(ray)
    head = spec["headGroupSpec"]["template"]["spec"]
    assert "initContainers" not in head and "SYS_PTRACE" not in json.dumps(head)  # nothing trains on the head
    pod = spec["workerGroupSpecs"][0]["template"]["spec"]
    (init,) = pod["initContainers"]
    worker = pod["containers"][0]
    assert init["command"] == ["ray-ormas", "ptrace-py-spy", PY_SPY_DIR] and init["image"] == worker["image"]
    assert init["securityContext"] == {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["SETFCAP"]},
    }
    assert worker["securityContext"] == {
        "allowPrivilegeEscalation": True,  # no no_new_privs: the copy's file capability takes effect
        "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE"]},  # in the bounding set, effective for py-spy only
    }
    assert {"name": "RAY_ORMAS_PY_SPY", "value": f"{PY_SPY_DIR}/py-spy"} in worker["env"]
    mounts = {m["name"]: m for m in worker["volumeMounts"]}
    assert mounts["ray-ormas-py-spy"] == {"name": "ray-ormas-py-spy", "mountPath": PY_SPY_DIR, "readOnly": True}
    assert init["volumeMounts"] == [{"name": "ray-ormas-py-spy", "mountPath": PY_SPY_DIR}]
    assert {v["name"]: v for v in pod["volumes"]}["ray-ormas-py-spy"]["emptyDir"]
    for other in VARIANTS:  # no other variant grants anything of it
        if other != "overlays/diagnose":
            assert "SYS_PTRACE" not in json.dumps(render(K8S / other)) and "SETFCAP" not in json.dumps(
                render(K8S / other)
            )


@pytest.mark.timeout(120)
def test_the_diagnose_init_container_gives_a_non_root_py_spy_the_stacks_of_another_users_process(tmp_path):
    # What the diagnose component does in a worker pod, on this machine: the init container's
    # command, as root, writes the copy; then a non-root user (as Ray's user in the pod) runs the
    # py-spy command line the diagnose action runs (head/rank_stacks.py), with RAY_ORMAS_PY_SPY as
    # the pod sets it, on a process it could not read otherwise (here: another user's, as Yama's
    # ptrace_scope makes a Ray worker in a pod). Without the copy, py-spy is refused.
    import shutil

    from ray_ormas._internal.head import rank_stacks

    python = "/usr/bin/python3"  # a Python every user may run (the suite's own is under /root)
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not os.access(python, os.X_OK):
        pytest.skip("needs root, setpriv (util-linux) and /usr/bin/python3, as the CI machine has")
    (rayjob,) = by_kind(render(K8S / "overlays/diagnose"), "RayJob")
    (init,) = cluster_spec(rayjob)["workerGroupSpecs"][0]["template"]["spec"]["initContainers"]
    folder = tmp_path / "py-spy-dir"
    command = [str(ROOT / ".venv" / "bin" / init["command"][0]), *init["command"][1:-1], str(folder)]
    if not Path(command[0]).exists():
        command[0] = str(Path(sys.executable).parent / init["command"][0])
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "may read the stacks of this pod's processes" in done.stderr + done.stdout
    tmp_path.chmod(0o755)  # the non-root user reaches the copy, as in the pod's emptyDir
    as_user = ["setpriv", "--reuid=65533", "--regid=65533", "--clear-groups"]
    waits = "import time\ndef waiting_for_the_fleet():\n    time.sleep(60)\nwaiting_for_the_fleet()"
    target = subprocess.Popen(["setpriv", "--reuid=65532", "--regid=65532", "--clear-groups", python, "-c", waits])
    try:
        time.sleep(1.0)
        plain = rank_stacks.dump_command(target.pid)
        refused = subprocess.run([*as_user, *plain], capture_output=True, text=True, timeout=40)
        os.environ[rank_stacks.PY_SPY_ENV] = str(folder / "py-spy")
        try:
            granted = rank_stacks.dump_command(target.pid)
        finally:
            del os.environ[rank_stacks.PY_SPY_ENV]
        read = subprocess.run([*as_user, *granted], capture_output=True, text=True, timeout=40)
    finally:
        target.kill()
        target.wait(10)
    assert refused.returncode != 0 and "Permission Denied" in refused.stdout + refused.stderr
    assert granted[0] == str(folder / "py-spy")
    assert read.returncode == 0 and "waiting_for_the_fleet" in read.stdout, read.stdout + read.stderr


def test_the_ptrace_py_spy_command_says_what_to_do_when_it_cannot(tmp_path, caplog):
    from ray_ormas._internal.cli.main import main

    (tmp_path / "file").write_text("")
    assert main(["ptrace-py-spy", str(tmp_path / "file" / "dir")]) == 2  # a file where the folder should be
    assert "mount a writable emptyDir there" in caplog.text


def test_the_s3_and_cpu_variants():
    s3 = render(K8S / "overlays/s3")
    (rayjob,) = by_kind(s3, "RayJob")
    for pod in pod_specs(rayjob):
        container = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["RAY_ORMAS_STORAGE_PATH"].startswith("s3://")
        assert container["envFrom"] == [{"secretRef": {"name": "ray-ormas-s3"}}]
        assert "runs" not in {v["name"] for v in pod["volumes"]}
    assert not [o for o in s3 if o["metadata"]["name"] == "ray-ormas-runs"]
    cpu = render(K8S / "overlays/cpu")
    assert "nvidia.com/gpu" not in json.dumps(cpu)
    (rayjob,) = by_kind(cpu, "RayJob")
    assert rayjob["spec"]["entrypoint"].endswith("--set scaling.use_gpu=false --set fleet.nccl_hang_detector=off")
    (runs,) = [o for o in cpu if o["metadata"]["name"] == "ray-ormas-runs"]
    assert runs["spec"]["accessModes"] == ["ReadWriteOnce"]
    (pvc,) = [o for o in render(K8S / "rayjob") if o["metadata"]["name"] == "ray-ormas-runs"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def assert_kuberay_accepts_the_deletion_fields(rayjob: dict[str, Any]) -> None:
    """The RayJob rules KubeRay's operator checks beyond the CRD (ValidateRayJobSpec, master
    after v1.7.0): deletion rules exclude shutdownAfterJobFinishes; DeleteWorkers needs the
    autoscaler off; per condition each policy once, with TTLs DeleteWorkers <= DeleteCluster <=
    DeleteSelf; a suspended job needs shutdownAfterJobFinishes; TTLs need it too."""
    spec = rayjob["spec"]
    rules = spec.get("deletionStrategy", {}).get("deletionRules", [])
    if rules:
        assert not spec.get("shutdownAfterJobFinishes")
    if spec.get("ttlSecondsAfterFinished"):
        assert spec.get("shutdownAfterJobFinishes") is True
    if spec.get("suspend"):
        assert spec.get("shutdownAfterJobFinishes") is True and not rules
    by_condition: dict[str, dict[str, int]] = {}
    for rule in rules:
        condition = json.dumps({k: v for k, v in rule["condition"].items() if k != "ttlSeconds"})
        assert rule["policy"] not in by_condition.get(condition, {}), rule
        by_condition.setdefault(condition, {})[rule["policy"]] = rule["condition"].get("ttlSeconds", 0)
        if rule["policy"] == "DeleteWorkers":
            assert spec["rayClusterSpec"].get("enableInTreeAutoscaling") is not True
    for ttls in by_condition.values():
        order = [ttls[p] for p in ("DeleteWorkers", "DeleteCluster", "DeleteSelf") if p in ttls]
        assert order == sorted(order), ttls


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "raycluster"])
def test_what_goes_when_the_job_ends(variant):
    (rayjob,) = by_kind(render(K8S / variant), "RayJob")
    assert_kuberay_accepts_the_deletion_fields(rayjob)
    spec = rayjob["spec"]
    assert spec["backoffLimit"] == 0 and spec["rayClusterSpec"]["enableInTreeAutoscaling"] is False
    if variant == "overlays/kueue":  # created suspended in a LocalQueue; Kueue admits it whole
        assert spec["suspend"] is True and rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
        assert "deletionStrategy" not in spec and spec["ttlSecondsAfterFinished"] == 600
        return
    assert "suspend" not in spec and "shutdownAfterJobFinishes" not in spec
    rules = {
        (r["policy"], r["condition"].get("jobStatus") or r["condition"]["jobDeploymentStatus"]): r["condition"][
            "ttlSeconds"
        ]
        for r in spec["deletionStrategy"]["deletionRules"]
    }
    assert rules == {
        ("DeleteCluster", "SUCCEEDED"): 60,
        ("DeleteWorkers", "FAILED"): 0,
        ("DeleteCluster", "FAILED"): 3600,
        ("DeleteCluster", "Failed"): 600,
    }
    assert not [p for p, _ in rules if p == "DeleteSelf"]  # the RayJob and its status stay


def test_the_legacy_deletion_component_for_operators_without_the_feature_gate(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(K8S / "rayjob", tmp_path)],
                "components": [os.path.relpath(K8S / "components" / "legacy-deletion", tmp_path)],
            }
        )
    )
    (rayjob,) = by_kind(render(tmp_path), "RayJob")
    assert not validation_errors(rayjob)
    assert_kuberay_accepts_the_deletion_fields(rayjob)
    assert "deletionStrategy" not in rayjob["spec"] and rayjob["spec"]["shutdownAfterJobFinishes"] is True


def entrypoint_and_config(variant: str, tmp_path: Path) -> tuple[str, Path]:
    """The RayJob's entrypoint, with the ConfigMap's config written where the test can read it
    (the one change: the mount path /etc/ray-ormas/config.yaml becomes that file)."""
    objects = render(K8S / variant)
    (rayjob,) = by_kind(objects, "RayJob")
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "ray-ormas-job"]
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mount = {m["name"]: m["mountPath"] for m in head["containers"][0]["volumeMounts"]}["job-config"]
    config = tmp_path / "config.yaml"
    config.write_text(configmap["data"]["config.yaml"])
    command = rayjob["spec"]["entrypoint"]
    assert f"{mount}/config.yaml" in command
    return command.replace(f"{mount}/config.yaml", str(config)), config


def test_the_gpu_rayjob_entrypoint_and_config_are_valid(tmp_path):
    command, _ = entrypoint_and_config("rayjob", tmp_path)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "RAY_ORMAS_STORAGE_PATH": str(tmp_path / "runs"),
    }
    done = subprocess.run(
        ["bash", "-c", command + " --dry-run"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "use_gpu: true" in done.stdout and f"path: {tmp_path / 'runs'}" in done.stdout
    assert "nccl_hang_detector: fail" in done.stdout  # the GPU manifests carry the hang detector's switch


def cpu_entrypoint_environment(tmp_path: Path, storage: str, **more: str) -> tuple[str, dict[str, str]]:
    """The CPU overlay's entrypoint (the ConfigMap's config written into `tmp_path`) and the
    environment its pod gives it, with run storage at `storage`."""
    command, _ = entrypoint_and_config("overlays/cpu", tmp_path)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "RAY_ORMAS_STORAGE_PATH": storage,
        **more,
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    return command, env


def test_the_cpu_rayjob_entrypoint_with_storage_on_the_pvc_is_valid(tmp_path):
    """With run storage on the PVC's mount (a local folder), the CPU overlay's entrypoint resolves
    to the config the S3 run below trains, but for its storage: `--dry-run`. (Training with a local
    storage path on a cluster it joins is what docs/job-submit.md's `ray job submit` runs, checked
    by tests/test_doc_commands.py; one real run of this entrypoint, on S3, keeps the suite's fits.)"""
    command, env = cpu_entrypoint_environment(tmp_path, str(tmp_path / "runs"))
    done = subprocess.run(
        ["bash", "-c", command + " --dry-run"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0 and "config is valid" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"path: {tmp_path / 'runs'}" in done.stdout and "use_gpu: false" in done.stdout
    assert "nccl_hang_detector: 'off'" in done.stdout
    assert "name: digits-repair" in done.stdout and "repair: true" in done.stdout


@pytest.mark.timeout(300)
def test_the_cpu_rayjob_entrypoint_runs_for_real_with_storage_on_s3(ray_cluster, s3, tmp_path):
    """The CPU overlay's entrypoint and config, joining the session's Ray cluster, with run storage
    on the S3 API server as the S3 overlay's pods have it: a bucket URI in RAY_ORMAS_STORAGE_PATH,
    endpoint and credentials in the environment."""
    storage = f"{s3.bucket()}/runs"
    command, env = cpu_entrypoint_environment(tmp_path, storage, RAY_ADDRESS=ray_cluster.address_info["address"])
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "connecting to the Ray cluster at" in done.stdout
    assert "conv2.0       0         32        32             0  repaired" in done.stdout
    records = open_records(f"{storage}/digits-repair")
    (segment,) = records.segments()
    assert segment.complete and segment.path.endswith("digits-repair/ormas/model/segment-000")
    local = tmp_path / "copy"  # verified where it is read back: a local copy
    records.store.download(segment.path, local)
    assert verify_run(local).ok
