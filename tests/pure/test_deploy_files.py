"""deploy/: the Dockerfile, compose file and Kubernetes manifests say what Duet needs.

Docker and a cluster are not needed: the files are read and checked for the things that
matter — every worker runs ``celery -A workers worker`` on the threads pool with the
right ``-Q`` and its concurrency from ``DUET_WORKER_CONCURRENCY``, each queue has a pool
and a KEDA trigger on the list Celery uses for it (:data:`orchestration.state.keys.QUEUE_*`),
grace periods outlast a model call, every ``DUET_*`` setting reaches the pods, images are
pinned, Flower asks for a login, the dev Redis has a password that only Duet's pods may
use, each pool has a disruption budget and is scraped for metrics, and no file holds a
secret. Every Kubernetes object of a built-in kind is validated against the Kubernetes
schema (kubernetes-validate); custom resources (KEDA, the Prometheus operator) are checked
field by field. Text checks always run; structural checks need PyYAML and are skipped
without it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestration.core.agents import AgentSpec
from orchestration.settings import Settings
from orchestration.state import keys

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
ALL_FILES = sorted(p for p in DEPLOY.rglob("*") if p.is_file())
YAML_FILES = sorted(p for p in ALL_FILES if p.suffix in (".yaml", ".yml"))
QUEUES = set(keys.ALL_QUEUES)
#: The default per-call timeout: a pool making model calls must outlast one.
MODEL_TIMEOUT_S = float(AgentSpec.model_fields["timeout_s"].default)
KEY_VARS = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "REDIS_PASSWORD",
    "FLOWER_BASIC_AUTH",
    "FLOWER_OAUTH2_SECRET",
    "GRAFANA_ADMIN_PASSWORD",
)
#: Every setting Duet reads from the environment: the Settings fields, and the key prefix.
DUET_SETTINGS = {f"DUET_{name.upper()}" for name in Settings.model_fields} | {"DUET_KEY_PREFIX"}
#: Settings that hold a password when they hold one at all: in a Secret on Kubernetes.
SECRET_SETTINGS = {"DUET_BROKER_URL", "DUET_FLEET_KEY"}
#: The Kubernetes release the manifests are validated against.
K8S_VERSION = "1.31.0"
#: The port every worker serves Prometheus metrics on in deploy/.
METRICS_PORT = 9808
#: The image tag the manifests run: the project's version.
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]  # type: ignore[index]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- text checks (no YAML library needed) ------------------------------------------


def test_the_expected_files_exist() -> None:
    for name in (
        "Dockerfile",
        "compose.yaml",
        "README.md",
        "k8s/keda.yaml",
        "k8s/workers.yaml",
        "k8s/flower.yaml",
        "k8s/configmap.yaml",
        "k8s/secret.template.yaml",
        "k8s/alternatives/hpa.yaml",
        "k8s/kustomization.yaml",
        "k8s/pdb.yaml",
        "k8s/networkpolicy.yaml",
        "k8s/metrics.yaml",
        "k8s/monitoring/podmonitor.yaml",
        "prometheus/prometheus.yml",
        "grafana/duet.json",
    ):
        assert (DEPLOY / name).is_file(), f"deploy/{name} is missing"


@pytest.mark.parametrize("path", ALL_FILES, ids=rel)
def test_no_file_holds_an_api_key(path: Path) -> None:
    text = path.read_text()
    # An OpenAI / Anthropic key starts with "sk-" (not "task-", hence the look-behind).
    found = re.findall(r"(?<![A-Za-z0-9_])sk-[A-Za-z0-9_\-]*", text)
    assert not found, f"{rel(path)} holds what looks like an API key: {found}"
    assert not re.search(r"AKIA[0-9A-Z]{16}", text), f"{rel(path)} holds an AWS key id"


@pytest.mark.parametrize("path", [*YAML_FILES, DEPLOY / "Dockerfile"], ids=rel)
def test_key_variables_are_never_given_a_value(path: Path) -> None:
    allowed = re.compile(r'^(""|\'\'|\$\{?\w+.*|<[^>]*>|)$')
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for var in KEY_VARS:
            # A reference (``${REDIS_PASSWORD}``) is not a value given to the variable.
            m = re.search(rf"(?<!\$\{{)(?<!\$\$\{{)\b{var}\b\s*[:=]\s*(\S*)", line)
            if m:
                assert allowed.match(m.group(1)), f"{rel(path)}:{n} gives {var} a value"


def dockerfile_lines() -> str:
    """The Dockerfile with continuation lines joined."""
    return re.sub(r"\\\n\s*", " ", (DEPLOY / "Dockerfile").read_text())


def dockerfile_cmd() -> list[str]:
    cmd = [line for line in dockerfile_lines().splitlines() if line.startswith("CMD ")]
    assert len(cmd) == 1, "the Dockerfile has one CMD, in exec form"
    argv: list[str] = json.loads(cmd[0][4:])
    return argv


def test_dockerfile_runs_a_non_root_threads_worker_on_every_queue() -> None:
    text = dockerfile_lines()
    bases = re.findall(r"^FROM (\S+)", text, re.M)
    assert bases and all(re.fullmatch(r"python:3\.11\.\d+-slim-\w+", b) for b in bases), (
        f"base images pinned to a patch release: {bases}"
    )
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the image runs as root"
    assert re.search(r"pip install .*\bduet\b|pip install .*\s\.(\s|$)", text), (
        "installs the project"
    )
    assert re.search(r"^HEALTHCHECK .*celery -A workers inspect ping", text, re.M)
    argv = dockerfile_cmd()
    assert argv[:4] == ["celery", "-A", "workers", "worker"]
    opts = worker_options(argv)
    assert opts["pool"] == "threads" and opts["events"]
    assert opts["concurrency"] is None, "threads come from DUET_WORKER_CONCURRENCY, not -c"
    assert re.search(r"^ENV .*\bDUET_WORKER_CONCURRENCY=200\b", text, re.M)
    assert set(opts["queues"]) == QUEUES


def test_keda_lists_are_the_celery_queue_names_by_text() -> None:
    text = (K8S / "keda.yaml").read_text()
    names = re.findall(r"^\s*listName:\s*['\"]?([\w.-]+)['\"]?$", text, re.M)
    assert sorted(names) == sorted(keys.queue_key(q) for q in QUEUES)
    assert {keys.queue_key(q) for q in keys.ALL_QUEUES} == set(names)
    # the drafts' list (depth-first scheduling), as YAML's escapes write it
    drafts = keys.queue_key(keys.QUEUE_ACTOR, keys.DRAFT_PRIORITY).replace("\x06\x16", "\\x06\\x16")
    assert f'listName: "{drafts}"' in text


# --- helpers ------------------------------------------------------------------------


def worker_options(argv: list[str]) -> dict[str, Any]:
    """The options of a ``celery ... worker`` command line that the checks look at."""
    opts: dict[str, Any] = {
        "app": None,
        "pool": None,
        "concurrency": None,
        "queues": [],
        "events": False,
        "is_worker": "worker" in argv,
    }
    it = iter(range(len(argv)))
    for i in it:
        arg = argv[i]
        name, eq, inline = arg.partition("=")
        value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        field = {
            "-A": "app",
            "--app": "app",
            "-P": "pool",
            "--pool": "pool",
            "-c": "concurrency",
            "--concurrency": "concurrency",
            "-Q": "queues",
            "--queues": "queues",
        }.get(name)
        if field:
            opts[field] = value.split(",") if field == "queues" else value
            if not eq:
                next(it, None)
        elif arg in ("-E", "--task-events"):
            opts["events"] = True
    return opts


def check_worker(argv: list[str], where: str) -> list[str]:
    """Assert the worker basics; return its queues."""
    assert argv[0] == "celery", f"{where}: starts with celery"
    opts = worker_options(argv)
    assert opts["app"] == "workers", f"{where}: uses -A workers"
    assert opts["pool"] == "threads", f"{where}: runs the threads pool"
    assert opts["queues"], f"{where}: names its queues with -Q"
    assert set(opts["queues"]) <= QUEUES, f"{where}: unknown queue in {opts['queues']}"
    assert opts["events"], f"{where}: sends task events (-E) for Flower"
    assert opts["concurrency"] is None, f"{where}: no -c (DUET_WORKER_CONCURRENCY decides)"
    queues: list[str] = opts["queues"]
    return queues


def seconds(value: Any) -> float:
    """Compose durations (``3m``, ``90s``, ``1m30s``) or plain numbers, in seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    total = 0.0
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)", str(value)):
        total += float(amount) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}[unit]
    return total


# --- structural checks (PyYAML) -----------------------------------------------------


@pytest.fixture(scope="module")
def yaml() -> Any:
    return pytest.importorskip("yaml")


def load_all(yaml: Any, path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_docs(yaml: Any) -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in load_all(yaml, path):
            yield path, doc


@pytest.mark.parametrize("path", YAML_FILES, ids=rel)
def test_every_yaml_file_parses(yaml: Any, path: Path) -> None:
    docs = load_all(yaml, path)
    assert docs and all(isinstance(d, dict) for d in docs), f"{rel(path)} has no mapping"


@pytest.mark.parametrize("path", YAML_FILES, ids=rel)
def test_no_yaml_mapping_repeats_a_key(yaml: Any, path: Path) -> None:
    """A repeated key is silently the last one for YAML readers (compose, kubectl)."""

    def check(node: Any) -> None:
        if isinstance(node, yaml.MappingNode):
            seen = [k.value for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"]
            repeated = sorted({k for k in seen if seen.count(k) > 1})
            assert not repeated, f"{rel(path)}:{node.start_mark.line + 1} repeats {repeated}"
            for k, v in node.value:
                check(k)
                check(v)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                check(item)

    for doc in yaml.compose_all(path.read_text(), Loader=yaml.SafeLoader):
        check(doc)


def test_compose_has_one_scalable_pool_per_queue(yaml: Any) -> None:
    compose = load_all(yaml, DEPLOY / "compose.yaml")[0]
    services = compose["services"]
    pools: dict[str, str] = {}
    for name, svc in services.items():
        command = svc.get("command")
        if isinstance(command, list) and "worker" in command and command[0] == "celery":
            queues = check_worker(command, f"compose service {name}")
            assert len(queues) == 1, f"{name}: one queue per pool, got {queues}"
            pools[queues[0]] = name
            assert "replicas" in svc.get("deploy", {}), f"{name}: scalable with deploy.replicas"
            grace = seconds(svc.get("stop_grace_period", "10s"))
            if queues[0] != keys.QUEUE_COORDINATOR:
                assert grace > MODEL_TIMEOUT_S, f"{name}: stop_grace_period under one model call"
    assert set(pools) == QUEUES, f"a pool per queue, got {pools}"

    redis = services["redis"]
    assert str(redis["image"]).startswith("redis:7")
    volume = redis["volumes"][0].split(":")[0]
    assert volume in compose["volumes"], "Redis keeps its data on a named volume"


def test_compose_env_passes_keys_through_without_values(yaml: Any) -> None:
    services = load_all(yaml, DEPLOY / "compose.yaml")[0]["services"]
    for name, svc in services.items():
        env = svc.get("environment") or {}
        if isinstance(env, list):
            env = dict(e.partition("=")[::2] if "=" in e else (e, None) for e in env)
        for var, value in env.items():
            if var in KEY_VARS:
                assert value is None or re.fullmatch(rf"\$\{{{var}(:?-)?\}}", str(value)), (
                    f"compose {name}: {var} must come from the host environment"
                )
        if "worker" in (svc.get("command") or []):
            assert "DUET_REDIS_URL" in env, f"compose {name}: DUET_REDIS_URL is set"
            pool = check_worker(svc["command"], name)[0]
            has_keys = {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"} <= set(env)
            assert has_keys == (pool != keys.QUEUE_COORDINATOR), (
                f"compose {name}: vendor keys go to the actor and critic pools only"
            )


def test_compose_flower_and_fake_llm(yaml: Any) -> None:
    services = load_all(yaml, DEPLOY / "compose.yaml")[0]["services"]
    flower = " ".join(services["flower"]["command"])
    assert "duet flower --address=0.0.0.0" in flower
    assert any(str(p).endswith("5555") for p in services["flower"]["ports"])
    fake = services["fake-llm"]
    assert fake.get("profiles"), "the fake LLM only starts under a profile"
    assert "duet.standin.server" in fake["command"]


def test_k8s_manifests_are_namespace_agnostic(yaml: Any) -> None:
    for path, doc in k8s_docs(yaml):
        if doc.get("kind") == "Kustomization":
            continue
        assert "namespace" not in doc.get("metadata", {}), f"{rel(path)}: hard-coded namespace"


def deployments(yaml: Any) -> dict[str, dict[str, Any]]:
    return {
        doc["metadata"]["name"]: doc
        for path, doc in k8s_docs(yaml)
        if doc.get("kind") == "Deployment" and path.parent == K8S
    }


def worker_pools(yaml: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """queue -> (deployment name, deployment) for every Celery worker Deployment."""
    pools: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, dep in deployments(yaml).items():
        container = dep["spec"]["template"]["spec"]["containers"][0]
        argv = [*container.get("command", []), *container.get("args", [])]
        if "worker" not in argv:
            continue
        queues = check_worker(argv, f"k8s Deployment {name}")
        assert len(queues) == 1, f"{name}: one queue per pool, got {queues}"
        assert queues[0] not in pools, f"two pools consume {queues[0]}"
        pools[queues[0]] = (name, dep)
    return pools


def test_k8s_worker_pools(yaml: Any) -> None:
    pools = worker_pools(yaml)
    assert set(pools) == QUEUES, f"a Deployment per queue, got {sorted(pools)}"
    for queue, (name, dep) in pools.items():
        spec = dep["spec"]["template"]["spec"]
        container = spec["containers"][0]
        grace = spec.get("terminationGracePeriodSeconds", 30)
        if queue != keys.QUEUE_COORDINATOR:
            assert grace > MODEL_TIMEOUT_S, f"{name}: grace period under one model call"
        assert container["resources"]["requests"], f"{name}: resource requests"
        assert container["resources"]["limits"]["memory"], f"{name}: a memory limit"
        refs = [next(iter(e.values()))["name"] for e in container.get("envFrom", [])]
        assert "duet-config" in refs, f"{name}: reads the duet-config ConfigMap"
        assert ("duet-api-keys" in refs) == (queue != keys.QUEUE_COORDINATOR), (
            f"{name}: vendor keys go to the actor and critic pools only"
        )
        user = spec.get("securityContext", {}).get("runAsUser")
        assert spec["securityContext"].get("runAsNonRoot") and user not in (None, 0)


def test_keda_scales_each_pool_on_its_queue_list(yaml: Any) -> None:
    pools = worker_pools(yaml)
    scaled = [doc for _, doc in k8s_docs(yaml) if doc.get("kind") == "ScaledObject"]
    seen = set()
    for obj in scaled:
        target = obj["spec"]["scaleTargetRef"]["name"]
        # one trigger per list of the pool's queue: the plain one, and the drafts' (actor)
        trigger, *drafts = obj["spec"]["triggers"]
        assert trigger["type"] == "redis"
        meta = trigger["metadata"]
        list_name = meta["listName"].removeprefix(keys.BROKER_PREFIX)
        assert list_name in QUEUES and meta["listName"] == keys.queue_key(list_name)
        want = [keys.queue_key(list_name, keys.DRAFT_PRIORITY)] if list_name == "actor" else []
        assert [d["metadata"]["listName"] for d in drafts] == want
        assert pools[list_name][0] == target, f"{target} scales on the wrong list {list_name}"
        assert int(meta["listLength"]) > 0
        assert meta.get("address") or meta.get("addressFromEnv") or meta.get("host")
        seen.add(list_name)
    assert seen == QUEUES


def test_hpa_alternative_targets_the_pools(yaml: Any) -> None:
    names = {name for name, _ in worker_pools(yaml).values()}
    hpas = load_all(yaml, K8S / "alternatives" / "hpa.yaml")
    assert {h["spec"]["scaleTargetRef"]["name"] for h in hpas} == names
    assert all(h["apiVersion"] == "autoscaling/v2" for h in hpas)


def test_secrets_are_templates_with_placeholders_only(yaml: Any) -> None:
    secrets = [(p, d) for p, d in k8s_docs(yaml) if d.get("kind") == "Secret"]
    assert secrets, "a Secret template exists"
    placeholder = re.compile(r"^(|<[^>]*>|REPLACE[_A-Z]*)$")
    for path, secret in secrets:
        assert "template" in path.name, f"{rel(path)}: a Secret lives only in a template"
        for field in ("stringData", "data"):
            for k, v in (secret.get(field) or {}).items():
                assert placeholder.match(str(v)), f"{rel(path)}: {k} has a value"
        assert "DUET_REDIS_URL" not in (secret.get("stringData") or {}), (
            "an empty DUET_REDIS_URL in a Secret would override the ConfigMap's"
        )


def test_configmap_holds_duet_settings_only(yaml: Any) -> None:
    (cm,) = [d for _, d in k8s_docs(yaml) if d.get("kind") == "ConfigMap"]
    data = cm["data"]
    assert data["DUET_REDIS_URL"].startswith(("redis://", "rediss://"))
    assert all(k.startswith("DUET_") for k in data)
    assert all(isinstance(v, str) for v in data.values()), "ConfigMap values are strings"
    assert not any(
        re.search(r"KEY|PASSWORD|SECRET|TOKEN", k)
        for k in set(data) - {"DUET_KEY_PREFIX", "DUET_KEY_HOSTS"}  # names, not values
    )


def test_flower_deployment_and_service(yaml: Any) -> None:
    dep = deployments(yaml)["duet-flower"]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    line = " ".join([*container.get("command", []), *container.get("args", [])])
    assert "duet flower --address=0.0.0.0 --port=5555" in line
    (svc,) = [
        d
        for _, d in k8s_docs(yaml)
        if d.get("kind") == "Service" and d["metadata"]["name"] == "duet-flower"
    ]
    assert svc["spec"]["ports"][0]["port"] == 5555
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()


def test_kustomization_lists_existing_files(yaml: Any) -> None:
    kust = load_all(yaml, K8S / "kustomization.yaml")[0]
    for res in kust["resources"]:
        assert (K8S / res).is_file(), f"kustomization names a missing file {res}"
    assert "secret.template.yaml" not in kust["resources"]


def test_deployment_selectors_match_their_pods(yaml: Any) -> None:
    for name, dep in deployments(yaml).items():
        selector = dep["spec"]["selector"]["matchLabels"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), f"{name}: selector does not match its pods"


# --- settings, images, resources ----------------------------------------------------


def compose_services(yaml: Any) -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = load_all(yaml, DEPLOY / "compose.yaml")[0]["services"]
    return services


def test_compose_passes_every_duet_setting_to_every_duet_process(yaml: Any) -> None:
    for name, svc in compose_services(yaml).items():
        image = str(svc.get("image", ""))
        if not image.startswith("${DUET_IMAGE") or name == "fake-llm":
            continue
        env = set(svc.get("environment") or {})
        missing = DUET_SETTINGS - env - {"DUET_WORKER_CONCURRENCY", "DUET_METRICS_PORT"}
        assert not missing, f"compose {name}: {sorted(missing)} not passed through"
        if "worker" in (svc.get("command") or []):
            assert {"DUET_WORKER_CONCURRENCY", "DUET_METRICS_PORT"} <= env, (
                f"compose {name}: concurrency and metrics port from the environment"
            )
            concurrency = str(svc["environment"]["DUET_WORKER_CONCURRENCY"])
            assert concurrency.startswith("${"), f"{name}: concurrency from the host environment"


def test_k8s_configmap_names_every_duet_setting(yaml: Any) -> None:
    (cm,) = [d for _, d in k8s_docs(yaml) if d.get("kind") == "ConfigMap"]
    template = (K8S / "secret.template.yaml").read_text()
    for name in sorted(DUET_SETTINGS):
        if name in SECRET_SETTINGS:
            assert name in template, f"{name}: shown in the duet-redis Secret template"
        else:
            assert name in cm["data"], f"duet-config: {name} missing"
    assert cm["data"]["DUET_METRICS_PORT"] == str(METRICS_PORT)


def test_images_are_pinned(yaml: Any) -> None:
    images = [(f"compose {n}", s["image"]) for n, s in compose_services(yaml).items()]
    images += [
        (f"{rel(path)} {doc['metadata']['name']}", c["image"])
        for path, doc in k8s_docs(yaml)
        if doc.get("kind") == "Deployment"
        for c in doc["spec"]["template"]["spec"]["containers"]
    ]
    for where, image in images:
        image = re.sub(r"^\$\{DUET_IMAGE:-(.*)\}$", r"\1", str(image))
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest", f"{where}: {image} has no pinned tag"
        assert re.fullmatch(r"v?\d+\.\d+\.\d+(-[\w.]+)?", tag), f"{where}: {image} not x.y.z"
        if name == "duet":
            assert tag == VERSION, f"{where}: duet image {tag}, project version {VERSION}"
    kust = load_all(yaml, K8S / "kustomization.yaml")[0]
    assert [i["newTag"] for i in kust["images"]] == [VERSION]


def test_every_k8s_container_has_requests_and_limits(yaml: Any) -> None:
    for path, doc in k8s_docs(yaml):
        if doc.get("kind") != "Deployment":
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            res = c.get("resources", {})
            where = f"{rel(path)} {doc['metadata']['name']}"
            assert {"cpu", "memory"} <= set(res.get("requests", {})), f"{where}: requests"
            assert "memory" in res.get("limits", {}), f"{where}: a memory limit"
            if path.parent == K8S:
                assert "cpu" in res.get("limits", {}), f"{where}: a CPU limit"


# --- schema ----------------------------------------------------------------------------

#: Custom resources: (apiVersion, kind) -> fields each must have (dotted paths).
CUSTOM = {
    ("keda.sh/v1alpha1", "ScaledObject"): ("spec.scaleTargetRef.name", "spec.triggers"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"): ("spec.secretTargetRef",),
    ("monitoring.coreos.com/v1", "PodMonitor"): ("spec.selector", "spec.podMetricsEndpoints"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("spec.selector", "spec.endpoints"),
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"): ("resources",),
}


def _field(doc: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        doc = doc[part]
    return doc


def test_k8s_objects_match_the_kubernetes_schema(yaml: Any) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    checked = 0
    for path, doc in k8s_docs(yaml):
        custom = CUSTOM.get((doc.get("apiVersion"), doc.get("kind")))
        if custom is not None:
            for field in custom:
                assert _field(doc, field), f"{rel(path)} {doc['kind']}: {field} is empty"
            continue
        try:
            kv.validate(doc, K8S_VERSION, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{rel(path)} {doc.get('kind')} {doc['metadata']['name']}: {exc}")
        checked += 1
    assert checked >= 15


def test_the_schema_check_catches_a_mistake(yaml: Any) -> None:
    """The validator is live: an unknown field and a wrong type are refused."""
    kv = pytest.importorskip("kubernetes_validate")
    dep = deployments(yaml)["duet-worker-actor"]
    bad = json.loads(json.dumps(dep))
    bad["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSION, strict=True)
    bad = json.loads(json.dumps(dep))
    bad["spec"]["replicas"] = "one"
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSION, strict=True)


# --- disruption, network, scraping, logins -------------------------------------------


def test_each_pool_has_a_disruption_budget(yaml: Any) -> None:
    pdbs = [d for _, d in k8s_docs(yaml) if d.get("kind") == "PodDisruptionBudget"]
    for name, dep in worker_pools(yaml).values():
        labels = dep["spec"]["template"]["metadata"]["labels"]
        mine = [p for p in pdbs if p["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(mine) == 1, f"{name}: one PodDisruptionBudget, got {len(mine)}"
        spec = mine[0]["spec"]
        assert spec.get("maxUnavailable") == 1 or spec.get("minAvailable") is not None


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In"
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def test_only_duet_pods_and_keda_reach_the_dev_redis(yaml: Any) -> None:
    (policy,) = [d for _, d in k8s_docs(yaml) if d.get("kind") == "NetworkPolicy"]
    (redis_dep,) = [
        d for p, d in k8s_docs(yaml) if p.parent.name == "dev" and d.get("kind") == "Deployment"
    ]
    assert _matches(
        policy["spec"]["podSelector"], redis_dep["spec"]["template"]["metadata"]["labels"]
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [6379]
    pods = {
        name: d["spec"]["template"]["metadata"]["labels"] for name, d in deployments(yaml).items()
    }
    allowed = {
        n
        for n, labels in pods.items()
        if any("podSelector" in f and _matches(f["podSelector"], labels) for f in rule["from"])
    }
    assert allowed == set(pods), f"pods that cannot reach Redis: {set(pods) - allowed}"
    other = {"app.kubernetes.io/name": "something-else", "app.kubernetes.io/component": "web"}
    assert not any("podSelector" in f and _matches(f["podSelector"], other) for f in rule["from"])
    namespaces = [f["namespaceSelector"] for f in rule["from"] if "namespaceSelector" in f]
    assert namespaces == [{"matchLabels": {"kubernetes.io/metadata.name": "keda"}}]


def test_the_dev_redis_has_a_password(yaml: Any) -> None:
    (dep,) = [
        d for p, d in k8s_docs(yaml) if p.parent.name == "dev" and d.get("kind") == "Deployment"
    ]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    script = " ".join([*container.get("command", []), *container.get("args", [])])
    assert "requirepass $REDIS_PASSWORD" in script and "exit 2" in script
    env = {e["name"]: e for e in container["env"]}
    ref = env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == "duet-redis" and not ref.get("optional")
    redis = compose_services(yaml)["redis"]
    assert "requirepass $$REDIS_PASSWORD" in " ".join(redis["command"])
    assert "REDIS_PASSWORD" in redis["environment"]
    default_url = compose_services(yaml)["worker-actor"]["environment"]["DUET_REDIS_URL"]
    assert "${REDIS_PASSWORD" in default_url, "the compose default URL carries the password"
    for obj in [d for _, d in k8s_docs(yaml) if d.get("kind") == "ScaledObject"]:
        assert obj["spec"]["triggers"][0]["authenticationRef"]["name"] == "duet-redis"


def test_flower_always_asks_for_a_login(yaml: Any) -> None:
    for path in ALL_FILES:
        assert "FLOWER_UNAUTHENTICATED_API" not in path.read_text(), rel(path)
    flower = compose_services(yaml)["flower"]
    script = " ".join(flower["command"])
    assert re.search(
        r'if \[ -z "\$\$FLOWER_BASIC_AUTH\$\$FLOWER_AUTH" \]; then.*exit 2', script, re.S
    )
    container = deployments(yaml)["duet-flower"]["spec"]["template"]["spec"]["containers"][0]
    script = " ".join(container["args"])
    assert re.search(r'if \[ -z "\$FLOWER_BASIC_AUTH\$FLOWER_AUTH" \]; then.*exit 2', script, re.S)
    (ref,) = [
        e["secretRef"]
        for e in container["envFrom"]
        if e.get("secretRef", {}).get("name") == "duet-flower"
    ]
    assert not ref.get("optional"), "Flower does not start without its login Secret"


def test_every_worker_pod_is_scraped_for_metrics(yaml: Any) -> None:
    for _queue, (name, dep) in worker_pools(yaml).items():
        template = dep["spec"]["template"]
        notes = template["metadata"].get("annotations", {})
        assert notes.get("prometheus.io/scrape") == "true", name
        assert notes.get("prometheus.io/port") == str(METRICS_PORT), name
        ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
        assert ports["metrics"] == METRICS_PORT
    exporter = deployments(yaml)["duet-metrics"]["spec"]["template"]
    container = exporter["spec"]["containers"][0]
    assert container["command"][:2] == ["duet", "metrics"]
    port = int(container["command"][container["command"].index("--port") + 1])
    assert exporter["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    monitors = load_all(yaml, K8S / "monitoring" / "podmonitor.yaml")
    (pods,) = [m for m in monitors if m["kind"] == "PodMonitor"]
    for _name, dep in worker_pools(yaml).values():
        assert _matches(pods["spec"]["selector"], dep["spec"]["template"]["metadata"]["labels"])


def test_compose_prometheus_scrapes_every_pool_and_the_exporter(yaml: Any) -> None:
    config = load_all(yaml, DEPLOY / "prometheus" / "prometheus.yml")[0]
    services = compose_services(yaml)
    pools = {n for n, s in services.items() if "worker" in (s.get("command") or [])}
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    (sd,) = jobs["duet-workers"]["dns_sd_configs"]
    assert set(sd["names"]) == pools and sd["port"] == METRICS_PORT
    for pool in pools:
        assert services[pool]["environment"]["DUET_METRICS_PORT"] == str(METRICS_PORT)
    (static,) = jobs["duet-fleet"]["static_configs"]
    port = services["metrics"]["command"][services["metrics"]["command"].index("--port") + 1]
    assert static["targets"] == [f"metrics:{port}"]
