"""The KubeRay manifests in k8s/: every variant renders (tests/kustomize.py), every RayJob and
RayCluster validates against the KubeRay CRD schemas with unknown fields rejected, every core
object against Kubernetes' own schemas (kubernetes-validate, strict), the policies hold (token
auth, pinned images, no hostPath, non-root, GPU worker group), and the RayJob's entrypoint with
the ConfigMap's config runs for real against the session's local Ray cluster (CPU)."""
from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import kubernetes_validate
import pytest
import yaml
from ormas_monitor.record import verify_run

from .conftest import ROOT
from .kustomize import render

K8S = ROOT / "k8s"
CRDS = ROOT / "tests" / "data" / "kuberay-crds"
VARIANTS = ["rayjob", "raycluster", "overlays/s3", "overlays/cpu"]
KUBERNETES_VERSION = "1.33.0"
RAY_VERSION = "2.60.0"


@functools.lru_cache(maxsize=None)
def crd_schema(kind: str) -> dict[str, Any]:
    """The CRD's v1 openAPIV3Schema as a JSON schema that rejects unknown fields (like the API
    server's strict field validation)."""
    path = CRDS / {"RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml"}[kind]
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))


def strict(node: Any) -> Any:
    if isinstance(node, dict):
        if node.pop("x-kubernetes-int-or-string", False):
            node.pop("type", None)
            node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if "properties" in node and "additionalProperties" not in node \
                and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        for value in node.values():
            strict(value)
    elif isinstance(node, list):
        for value in node:
            strict(value)
    return node


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
            errors = sorted(jsonschema.Draft7Validator(crd_schema(obj["kind"])).iter_errors(obj), key=str)
            assert not errors, f"{obj['kind']}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_crd_check_rejects_an_unknown_field():
    (rayjob,) = by_kind(render(K8S / "rayjob"), "RayJob")
    rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParam"] = {}       # a typo
    errors = list(jsonschema.Draft7Validator(crd_schema("RayJob")).iter_errors(rayjob))
    assert any("rayStartParam" in e.message for e in errors)
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
        for c in pod["containers"]:
            assert c["image"].endswith(f"-ray{RAY_VERSION}-gpu") or c["image"].endswith(f"-ray{RAY_VERSION}-cpu")
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
    (mlflow,) = by_kind(objects, "Deployment")
    (pod,) = pod_specs(mlflow)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["image"] == "ghcr.io/mlflow/mlflow:v3.17.2"
    assert {e["secretRef"]["name"] for e in pod["containers"][0]["envFrom"]} == {"ray-ormas-mlflow"}
    assert {o["kind"] for o in objects if o["metadata"]["name"] == "ray-ormas-mlflow"} == {
        "Deployment", "Service", "PersistentVolumeClaim", "Secret"}
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in head["env"]}
    assert env["MLFLOW_TRACKING_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "ray-ormas-mlflow"
    assert env["MLFLOW_TRACKING_URI"]["value"] == "http://ray-ormas-mlflow:5000"


@pytest.mark.parametrize("variant", ["rayjob", "raycluster", "overlays/s3"])
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
    assert {e["name"] for e in worker["env"]} >= {"NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_DEBUG"}
    assert not [e["name"] for e in worker["env"] if e["name"].startswith("MLFLOW_")]   # only the head talks to MLflow
    assert "ray-ormas-mlflow" not in str(worker)
    assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


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
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "RAY_ORMAS_STORAGE_PATH": str(tmp_path / "runs")}
    done = subprocess.run(["bash", "-c", command + " --dry-run"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "use_gpu: true" in done.stdout and f"path: {tmp_path / 'runs'}" in done.stdout
    assert "nccl_hang_detector: fail" in done.stdout        # the GPU manifests carry the hang detector's switch


@pytest.mark.timeout(300)
def test_the_cpu_rayjob_entrypoint_runs_for_real(ray_cluster, tmp_path):
    command, _ = entrypoint_and_config("overlays/cpu", tmp_path)
    storage = tmp_path / "runs"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "RAY_ORMAS_STORAGE_PATH": str(storage), "RAY_ADDRESS": ray_cluster.address_info["address"]}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "connecting to the Ray cluster at" in done.stdout
    assert "conv2.0       0         32        32             0  repaired" in done.stdout
    record = storage / "digits-repair" / "ormas" / "model" / "segment-000"
    assert verify_run(record).ok
