"""deploy/: the Kubernetes manifests and the image, checked without a cluster or a docker engine.

Every resource is validated against Kubernetes' own OpenAPI schema (kubernetes-validate, strict, so
an unknown or misspelt field fails), then against the code it runs: the server's args are parsed by
reference_server.config's parser and the sweep's by perfkit's, so a renamed flag or port breaks
this test rather than a pod.
"""

from __future__ import annotations

import copy
import re
import shlex
from importlib.metadata import distribution
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from perfkit.cli import build_parser as build_perfkit_parser
from perfkit.cli.sweep import spec_from_args
from perfkit.errors import ExitCode
from reference_server.config import ServerConfig, config_from_args

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
KUBERNETES_VERSION = "1.30"
SERVER = "perfkit-server"

Doc = dict[str, Any]


def _load(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def _kustomizations() -> list[Path]:
    return sorted(K8S.rglob("kustomization.yaml"))


def _patch_files() -> set[Path]:
    patches: set[Path] = set()
    for kustomization in _kustomizations():
        for entry in _load(kustomization)[0].get("patches", []):
            patches.add((kustomization.parent / entry["path"]).resolve())
    return patches


def _resource_files() -> list[Path]:
    skip = _patch_files()
    return [p for p in sorted(K8S.rglob("*.yaml")) if p.name != "kustomization.yaml" and p.resolve() not in skip]


def _build(directory: Path) -> list[Doc]:
    """What `kustomize build DIR` gives for these manifests: resources, then patches in order."""
    kustomization = _load(directory / "kustomization.yaml")[0]
    docs: list[Doc] = []
    for entry in kustomization.get("resources", []):
        target = (directory / entry).resolve()
        docs.extend(_build(target) if target.is_dir() else _load(target))
    for entry in kustomization.get("patches", []):
        for patch in _load(directory / entry["path"]):
            matches = [
                d for d in docs if (d["kind"], d["metadata"]["name"]) == (patch["kind"], patch["metadata"]["name"])
            ]
            assert len(matches) == 1, f"{entry['path']} targets {patch['kind']}/{patch['metadata']['name']}: not found"
            docs[docs.index(matches[0])] = strategic_merge(matches[0], patch)
    return docs


def strategic_merge(base: Any, patch: Any) -> Any:
    """Kubernetes' strategic merge for what the overlays use: maps merge, `null` deletes a key,
    lists of named items (containers, volumes, initContainers) merge by name, `$patch: delete` drops
    an item, and any other list is replaced."""
    if not (isinstance(base, dict) and isinstance(patch, dict)):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif _named_list(value) and _named_list(merged.get(key)):
            merged[key] = _merge_named(merged[key], value)
        else:
            merged[key] = strategic_merge(merged.get(key), value)
    return merged


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(i, dict) and "name" in i for i in value)


def _merge_named(base: list[Doc], patch: list[Doc]) -> list[Doc]:
    items = {item["name"]: item for item in copy.deepcopy(base)}
    for item in patch:
        if item.get("$patch") == "delete":
            assert item["name"] in items, f"$patch: delete names {item['name']}, which the base does not have"
            del items[item["name"]]
        else:
            items[item["name"]] = strategic_merge(items.get(item["name"]), item)
    return list(items.values())


def _one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _container(pod: Doc, name: str) -> Doc | None:
    return next((c for c in pod.get("containers", []) if c["name"] == name), None)


# --------------------------------------------------------------------------------------------
# Consistency checks: each returns the problems it finds, so a test can show that they bite.


def pod_problems(pod: Doc, where: str) -> list[str]:
    problems = []
    volumes = {v["name"] for v in pod.get("volumes", [])}
    for container in pod.get("initContainers", []) + pod["containers"]:
        for mount in container.get("volumeMounts", []):
            if mount["name"] not in volumes:
                problems.append(f"{where}: {container['name']} mounts volume '{mount['name']}', which is not defined")
        context = container.get("securityContext", {})
        if context.get("readOnlyRootFilesystem") is not True or context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: {container['name']} needs readOnlyRootFilesystem and no privilege escalation")
        if "resources" not in container or "requests" not in container["resources"]:
            problems.append(f"{where}: {container['name']} has no resource requests")
    if pod.get("securityContext", {}).get("runAsNonRoot") is not True:
        problems.append(f"{where}: the pod must set runAsNonRoot")
    return problems


def _server_config(container: Doc) -> ServerConfig | str:
    try:
        return config_from_args([str(a) for a in container.get("args", [])])
    except SystemExit:
        return f"perfkit-server rejects its args {container.get('args')}"


def server_problems(deployment: Doc, service: Doc) -> list[str]:
    """The Deployment against the server's own flags, and the Service against the Deployment."""
    template = deployment["spec"]["template"]
    pod, labels = template["spec"], template["metadata"]["labels"]
    problems = pod_problems(pod, f"Deployment/{SERVER}")
    if not deployment["spec"]["selector"]["matchLabels"].items() <= labels.items():
        problems.append("the Deployment's selector does not match its pod labels")
    container = _container(pod, SERVER)
    if container is None:
        return [*problems, f"no container named {SERVER}"]
    config = _server_config(container)
    if isinstance(config, str):
        return [*problems, config]
    if config.host != "0.0.0.0":
        problems.append(f"--host is {config.host}: in a pod the server must bind 0.0.0.0")
    expected = {"http": config.http_port, "grpc": config.grpc_port, "metrics": config.metrics_port}
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    if ports != expected:
        problems.append(f"container ports {ports} differ from the server's flags {expected}")
    for probe, path in (("startupProbe", "/v2/health/ready"), ("readinessProbe", "/v2/health/ready"),
                        ("livenessProbe", "/v2/health/live")):  # fmt: skip
        get = container.get(probe, {}).get("httpGet", {})
        if (get.get("path"), get.get("port")) != (path, "http"):
            problems.append(f"{probe} must GET {path} on the named port 'http', not {get}")
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    if str(config.model_repository) not in mounts:
        problems.append(f"--model-repository {config.model_repository} is not a volume mount")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace <= config.exit_timeout_secs:
        problems.append(
            f"terminationGracePeriodSeconds {grace} must exceed --exit-timeout-secs {config.exit_timeout_secs}"
        )
    for builder in pod.get("initContainers", []):
        command = builder.get("command", [])
        if command[:3] == ["python", "-m", "v2kit.demo"]:
            builder_mounts = {m["mountPath"]: m["name"] for m in builder.get("volumeMounts", [])}
            if builder_mounts.get(command[3]) != mounts.get(str(config.model_repository)):
                problems.append("the demo models are built into a different volume than --model-repository")
    if not service["spec"]["selector"].items() <= labels.items():
        problems.append("the Service's selector does not match the server's pod labels")
    for port in service["spec"]["ports"]:
        if port["targetPort"] not in ports:
            problems.append(f"Service port {port['name']} targets '{port['targetPort']}', not a container port name")
        elif (port["name"], port["port"]) != (port["targetPort"], ports[port["targetPort"]]):
            problems.append(f"Service port {port['name']}:{port['port']} should mirror its container port")
    return problems


def job_problems(job: Doc, service: Doc, claims: set[str]) -> list[str]:
    """The sweep Job against perfkit's sweep parser and the Service it measures."""
    pod = job["spec"]["template"]["spec"]
    problems = pod_problems(pod, f"Job/{job['metadata']['name']}")
    if job["spec"].get("backoffLimit") is None or not job["spec"].get("activeDeadlineSeconds"):
        problems.append("the Job needs backoffLimit and activeDeadlineSeconds so a failing sweep stops")
    (container,) = pod["containers"]
    final = {ExitCode.USAGE, ExitCode.UNSTABLE, ExitCode.ERRORS}  # a retry would end the same way
    rules = job["spec"].get("podFailurePolicy", {}).get("rules", [])
    if not any(r["action"] == "FailJob" and set(r["onExitCodes"]["values"]) == final for r in rules):
        problems.append(f"the Job should not retry a sweep that exits {sorted(map(int, final))}")
    argv = [*container.get("command", [])[1:], *map(str, container["args"])]
    if container.get("command", [None])[0] != "perfkit" or argv[:1] != ["sweep"]:
        return [*problems, f"the Job must run `perfkit sweep`, not {container.get('command')} {argv}"]
    try:
        spec = spec_from_args(build_perfkit_parser().parse_args(argv))
    except SystemExit:
        return [*problems, f"perfkit sweep rejects {shlex.join(argv)}"]
    service_ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    endpoint = urlsplit(f"//{spec.target.url}")
    name = service["metadata"]["name"]
    if endpoint.hostname != name and not (endpoint.hostname or "").startswith(f"{name}."):
        problems.append(f"-u {spec.target.url} is not the Service {name}")
    if endpoint.port != service_ports.get(spec.target.protocol):
        problems.append(f"-u {spec.target.url} is not the Service's {spec.target.protocol} port")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    report_volume = volumes.get(mounts.get(str(spec.output.report_dir), ""), {})
    claim = report_volume.get("persistentVolumeClaim", {}).get("claimName")
    if claim not in claims:
        problems.append(f"--report-dir {spec.output.report_dir} is not on a PersistentVolumeClaim defined here")
    for waiter in pod.get("initContainers", []):
        url = urlsplit(str(waiter["command"][-1]))
        if (url.hostname, url.port, url.path) != (name, service_ports["http"], "/v2/health/ready"):
            problems.append(f"{waiter['name']} waits on {waiter['command'][-1]}, not the Service's readiness")
    return problems


# --------------------------------------------------------------------------------------------
# Tests


@pytest.fixture(scope="module")
def base() -> list[Doc]:
    return _build(K8S)


@pytest.mark.parametrize("path", _resource_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_every_resource_matches_the_kubernetes_schema(path: Path) -> None:
    for doc in _load(path):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", ["gpu", "model-pvc"])
def test_overlays_build_valid_resources(overlay: str) -> None:
    for doc in _build(K8S / overlay):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("kustomization", _kustomizations(), ids=lambda p: str(p.relative_to(K8S)))
def test_kustomizations_list_existing_files(kustomization: Path) -> None:
    content = _load(kustomization)[0]
    assert content["kind"] == "Kustomization"
    for entry in content.get("resources", []):
        target = kustomization.parent / entry
        assert target.is_file() or (target / "kustomization.yaml").is_file(), f"{kustomization}: {entry} is missing"
    for entry in content.get("patches", []):
        assert (kustomization.parent / entry["path"]).is_file(), f"{kustomization}: patch {entry['path']} is missing"


def test_every_resource_file_is_reachable_or_standalone() -> None:
    listed = {doc["metadata"]["name"] for doc in _build(K8S) + _build(K8S / "gpu") + _build(K8S / "model-pvc")}
    standalone = {"perfkit-reports-reader"}
    for path in _resource_files():
        for doc in _load(path):
            assert doc["metadata"]["name"] in listed | standalone, f"{path} is in no kustomization"


def test_server_matches_its_flags_and_service(base: list[Doc]) -> None:
    deployment, service = _one(base, "Deployment", SERVER), _one(base, "Service", SERVER)
    assert server_problems(deployment, service) == []


def test_sweep_job_targets_the_service(base: list[Doc]) -> None:
    claims = {d["metadata"]["name"] for d in base if d["kind"] == "PersistentVolumeClaim"}
    assert job_problems(_one(base, "Job", "perfkit-sweep"), _one(base, "Service", SERVER), claims) == []


def test_reports_reader_mounts_the_reports_claim(base: list[Doc]) -> None:
    (reader,) = _load(K8S / "reports-reader.yaml")
    job = _one(base, "Job", "perfkit-sweep")
    job_claims = {v["persistentVolumeClaim"]["claimName"] for v in job["spec"]["template"]["spec"]["volumes"]
                  if "persistentVolumeClaim" in v}  # fmt: skip
    assert pod_problems(reader["spec"], "Pod/perfkit-reports-reader") == []
    assert {v["persistentVolumeClaim"]["claimName"] for v in reader["spec"]["volumes"]} == job_claims


def _mutate(deployment: Doc, change: str) -> Doc:
    broken = copy.deepcopy(deployment)
    pod = broken["spec"]["template"]["spec"]
    container = _container(pod, SERVER)
    assert container is not None
    if change == "port name":
        container["ports"][0]["name"] = "rest"
    elif change == "flag value":
        container["args"][container["args"].index("--grpc-port") + 1] = "9001"
    elif change == "renamed flag":
        container["args"][container["args"].index("--http-port")] = "--rest-port"
    elif change == "loopback host":
        container["args"][container["args"].index("--host") + 1] = "127.0.0.1"
    elif change == "probe path":
        container["livenessProbe"]["httpGet"]["path"] = "/healthz"
    elif change == "missing volume":
        pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "tmp"]
    elif change == "short grace":
        pod["terminationGracePeriodSeconds"] = 10
    return broken


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ("port name", "container ports"),
        ("flag value", "container ports"),
        ("renamed flag", "rejects its args"),
        ("loopback host", "0.0.0.0"),
        ("probe path", "livenessProbe"),
        ("missing volume", "not defined"),
        ("short grace", "terminationGracePeriodSeconds"),
    ],
)
def test_server_checks_catch_a_broken_deployment(base: list[Doc], change: str, complaint: str) -> None:
    problems = server_problems(_mutate(_one(base, "Deployment", SERVER), change), _one(base, "Service", SERVER))
    assert any(complaint in p for p in problems), problems


def test_job_checks_catch_a_wrong_endpoint(base: list[Doc]) -> None:
    job = copy.deepcopy(_one(base, "Job", "perfkit-sweep"))
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    args[args.index("-u") + 1] = "perfkit-server:8001"  # the gRPC port, with -i http
    problems = job_problems(job, _one(base, "Service", SERVER), {"perfkit-reports"})
    assert any("http port" in p for p in problems), problems


def test_gpu_overlay_limits_one_gpu(base: list[Doc]) -> None:
    built = _build(K8S / "gpu")
    deployment = _one(built, "Deployment", SERVER)
    container = _container(deployment["spec"]["template"]["spec"], SERVER)
    assert container is not None
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    # The patch adds to the base's limits rather than replacing them.
    assert container["resources"]["limits"]["memory"] == "4Gi"
    assert server_problems(deployment, _one(built, "Service", SERVER)) == []
    base_container = _container(_one(base, "Deployment", SERVER)["spec"]["template"]["spec"], SERVER)
    assert base_container is not None and "nvidia.com/gpu" not in base_container["resources"]["limits"]


def test_model_pvc_overlay_serves_the_claim() -> None:
    built = _build(K8S / "model-pvc")
    deployment = _one(built, "Deployment", SERVER)
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "model-repository"]
    assert set(volume) == {"name", "persistentVolumeClaim"}
    _one(built, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert not pod.get("initContainers")
    assert server_problems(deployment, _one(built, "Service", SERVER)) == []


def _dockerfile() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    pairs = [line.partition(" ") for line in lines if line and not line.startswith("#")]
    return [(keyword.upper(), rest.strip()) for keyword, _, rest in pairs]


def test_dockerfile_installs_the_package_and_exposes_the_manifest_ports(base: list[Doc]) -> None:
    instructions = _dockerfile()
    scripts = {e.name for e in distribution("perfkit").entry_points if e.group == "console_scripts"}
    values = {keyword: rest for keyword, rest in reversed(instructions)}  # the first of each
    assert any(k == "RUN" and re.search(r"pip install \.(\s|$)", v) for k, v in instructions)
    copied = " ".join(v for k, v in instructions if k == "COPY")
    for needed in ("pyproject.toml", "perfkit", "reference_server"):
        assert needed in copied
    assert yaml.safe_load(values["ENTRYPOINT"]) == [SERVER] and SERVER in scripts and "perfkit" in scripts
    deployment = _one(base, "Deployment", SERVER)
    pod = deployment["spec"]["template"]["spec"]
    container = _container(pod, SERVER)
    assert container is not None
    assert {int(p) for p in values["EXPOSE"].split()} == {p["containerPort"] for p in container["ports"]}
    user = [v for k, v in instructions if k == "USER"][-1]
    assert user == str(pod["securityContext"]["runAsUser"]) and user != "0"
    # The image's own default command must be a valid server invocation too.
    default = _server_config({"args": yaml.safe_load([v for k, v in instructions if k == "CMD"][-1])})
    assert isinstance(default, ServerConfig) and default.host == "0.0.0.0"
    assert (DEPLOY / "Dockerfile.dockerignore").is_file()
