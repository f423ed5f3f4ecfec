"""A small kustomize renderer for the tests: what `kubectl apply -k DIR` would apply, as dicts.

kustomize itself cannot be installed on the test machine, so the tests render the overlays with
the subset of kustomize the manifests in k8s/ use, and refuse anything else (so the files cannot
drift into features this renderer would silently get wrong):

* `resources`: YAML files (several documents each) and directories with a kustomization.yaml;
* `patches` with `path` and an optional `target` (group, version, kind, name): either a list of
  JSON 6902 operations (add, replace, remove; RFC 6901 paths with ~0 and ~1), applied to every
  matching resource, or a strategic-merge patch that is exactly a `$patch: delete` of one
  resource (matched by apiVersion, kind and name).
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "patches"}


def render(directory: str | Path) -> list[dict[str, Any]]:
    directory = Path(directory)
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise NotImplementedError(f"{directory}/kustomization.yaml uses {sorted(unknown)}: not rendered by tests/kustomize.py")
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        if path.is_dir():
            objects += render(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for patch in kustomization.get("patches", []):
        if set(patch) - {"path", "target"}:
            raise NotImplementedError(f"patch {patch}: only path and target are rendered")
        body = yaml.safe_load((directory / patch["path"]).read_text())
        if isinstance(body, list):
            targets = [o for o in objects if _matches(o, patch.get("target", {}))]
            if not targets:
                raise ValueError(f"patch {patch['path']} matches no resource")
            for obj in targets:
                for op in body:
                    apply_operation(obj, op)
        elif isinstance(body, dict) and body.get("$patch") == "delete":
            key = (body["apiVersion"], body["kind"], body["metadata"]["name"])
            kept = [o for o in objects if (o["apiVersion"], o["kind"], o["metadata"]["name"]) != key]
            if len(kept) != len(objects) - 1:
                raise ValueError(f"delete patch {patch['path']} matches {len(objects) - len(kept)} resources")
            objects = kept
        else:
            raise NotImplementedError(f"patch {patch['path']}: only JSON 6902 lists and $patch: delete are rendered")
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    if len(names) != len(set(names)):
        raise ValueError(f"{directory}: duplicate resources {names}")
    return objects


def _matches(obj: dict[str, Any], target: dict[str, Any]) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    wanted = {"group": group, "version": version, "kind": obj["kind"], "name": obj["metadata"]["name"]}
    return all(wanted[k] == v for k, v in target.items())


def apply_operation(obj: dict[str, Any], op: dict[str, Any]) -> None:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    parent = obj
    for part in parts[:-1]:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    last = parts[-1]
    kind = op["op"]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if kind == "add":
            parent.insert(index, copy.deepcopy(op["value"]))
        elif kind == "replace":
            parent[index] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del parent[index]
        else:
            raise NotImplementedError(kind)
        return
    if kind in ("replace", "remove") and last not in parent:
        raise KeyError(f"{op['path']}: nothing to {kind}")
    if kind in ("add", "replace"):
        parent[last] = copy.deepcopy(op["value"])
    elif kind == "remove":
        del parent[last]
    else:
        raise NotImplementedError(kind)
