"""The deployment artefacts say only what the ledger understands.

No container engine or cluster runs here, so the ``Dockerfile``, the compose
file and the Kubernetes example are checked for what can be checked without
one: they parse; every ``LEDGER_*`` variable they set is a setting (or a
``LEDGER_KAFKA_<PROPERTY>`` pass-through of a real librdkafka property) and
its value is accepted; every command they run is a real ``ledger`` command
with arguments it takes; the image's entry point is a console script of the
wheel; the broker advertises its in-network listener by service name; the
keys and the client configuration reach every stage.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner
from confluent_kafka import KafkaException, Producer

from consumers.stages import STAGES
from ledger.cli import main as ledger_cli
from ledger.cli.stages import resolve_instance
from ledger.kafka import ENV_PREFIX, env_properties
from ledger.settings import LedgerSettings
from tests.helpers import PROJECT_ROOT

DOCKERFILE = PROJECT_ROOT / "Dockerfile"
COMPOSE = PROJECT_ROOT / "docker-compose.yml"
K8S = PROJECT_ROOT / "deploy" / "k8s"
PYPROJECT = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
IMAGE = "kafka-recovery-ledger"
#: Every variable a ledger process reads: its settings, and ``LEDGER_HOME``
#: (read by :func:`ledger.settings.ledger_home`, the default of the folders).
SETTINGS = {f"LEDGER_{name.upper()}" for name in LedgerSettings.model_fields} | {"LEDGER_HOME"}
LOOPBACK = {"127.0.0.1", "localhost", "0.0.0.0", "::1", ""}


# ---------------------------------------------------------------- reading the artefacts


def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


def _manifests() -> list[tuple[Path, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path, doc))
    return docs


def _kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in _manifests() if doc.get("kind") == kind]


def _env(block: Any) -> dict[str, str]:
    """A compose ``environment`` (mapping or ``KEY=value`` list) as a dict."""
    if block is None:
        return {}
    if isinstance(block, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in block)
    return {str(k): "" if v is None else str(v) for k, v in block.items()}


def _ledger_services() -> dict[str, dict[str, Any]]:
    """Compose services that run the ledger's image (built here)."""
    return {
        name: svc
        for name, svc in _compose()["services"].items()
        if "build" in svc or str(svc.get("image", "")).startswith(IMAGE)
    }


def _pod_specs() -> list[tuple[str, dict[str, Any]]]:
    """(workload name, pod spec) of every workload in the Kubernetes example."""
    specs = []
    for _, doc in _manifests():
        kind = doc.get("kind")
        if kind in ("StatefulSet", "Deployment", "Job"):
            specs.append((doc["metadata"]["name"], doc["spec"]["template"]["spec"]))
        elif kind == "CronJob":
            specs.append(
                (doc["metadata"]["name"], doc["spec"]["jobTemplate"]["spec"]["template"]["spec"])
            )
    return specs


def _ledger_containers() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(workload, pod spec, container) of every container running the ledger's image."""
    return [
        (name, spec, c)
        for name, spec in _pod_specs()
        for c in spec["containers"]
        if str(c["image"]).startswith(IMAGE)
    ]


def _config_maps() -> dict[str, dict[str, str]]:
    return {doc["metadata"]["name"]: doc.get("data", {}) for doc in _kind("ConfigMap")}


def _container_env(container: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    maps = _config_maps()
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        assert name in maps, f"envFrom names ConfigMap {name!r}, which the example lacks"
        env.update(maps[name])
    for item in container.get("env", []):
        env[item["name"]] = str(item.get("value", ""))
    return env


def _dockerfile_stages() -> list[tuple[str, list[str]]]:
    """(stage name, its instructions with continuations joined), in order."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            match = re.search(r"\bAS\s+(\S+)", line, re.IGNORECASE)
            stages.append((match.group(1) if match else f"stage{len(stages)}", [line]))
        elif stages:
            stages[-1][1].append(line)
    return stages


def _instruction(lines: list[str], word: str) -> list[str]:
    return [line[len(word) :].strip() for line in lines if line.upper().startswith(word + " ")]


# ---------------------------------------------------------------- checks


def test_compose_and_every_manifest_parse_as_yaml() -> None:
    services = _compose()["services"]
    assert {"kafka", "topics", "sink", *STAGES, "reconciler"} <= set(services)
    docs = _manifests()
    assert docs
    for path, doc in docs:
        assert {"apiVersion", "kind"} <= set(doc), path
        assert doc["kind"] == "Kustomization" or doc["metadata"].get("name"), path
    (kustomization,) = _kind("Kustomization")
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk, "kustomization.yaml lists every manifest and nothing else"


def _check_setting(name: str, value: str, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if name in SETTINGS:
        monkeypatch.setenv(name, value)
        return
    if not name.startswith(ENV_PREFIX):
        pytest.fail(f"{where}: {name} is no ledger setting")
    # A pass-through: accepted by the ledger, and a property librdkafka knows.
    (prop,) = env_properties({name: value}).values()
    try:
        Producer({"bootstrap.servers": "127.0.0.1:1", prop.key: prop.value})
    except KafkaException as exc:
        pytest.fail(f"{where}: {name} is no librdkafka property ({prop.key}): {exc}")


def _ledger_variables() -> list[tuple[str, dict[str, str]]]:
    found = [
        (f"compose {name}", _env(svc.get("environment")))
        for name, svc in _ledger_services().items()
    ]
    found += [(f"k8s {w}/{c['name']}", _container_env(c)) for w, _, c in _ledger_containers()]
    for stage, lines in _dockerfile_stages():
        env: dict[str, str] = {}
        for body in _instruction(lines, "ENV"):
            env.update(dict(pair.split("=", 1) for pair in shlex.split(body)))
        found.append((f"Dockerfile {stage}", env))
    return found


@pytest.mark.parametrize(
    "where, env", _ledger_variables(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_every_ledger_variable_is_a_setting_with_a_valid_value(
    where: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("LEDGER_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)
    ledger_vars = {k: v for k, v in env.items() if k.startswith("LEDGER_")}
    for name, value in ledger_vars.items():
        _check_setting(name, value, where, monkeypatch)
    settings = LedgerSettings()  # the values as the process would read them
    if "LEDGER_PARTITIONS" in ledger_vars:
        assert settings.partitions == int(ledger_vars["LEDGER_PARTITIONS"])
    if ledger_vars:
        assert settings.clock == "system", f"{where}: a deployment runs on the system clock"
        assert not settings.testbed


def test_ledger_home_is_read_by_the_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("LEDGER_RUN_DIR", raising=False)
    monkeypatch.setenv("LEDGER_HOME", str(tmp_path))
    assert LedgerSettings().run_dir == tmp_path / ".ledger"


def test_the_checker_refuses_a_variable_that_is_no_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(pytest.fail.Exception, match="no ledger setting"):
        _check_setting("LEDGER_PARTITION_COUNT", "3", "x", monkeypatch)
    with pytest.raises(pytest.fail.Exception, match="no librdkafka property"):
        _check_setting("LEDGER_KAFKA_NO_SUCH_THING", "1", "x", monkeypatch)


def _ledger_invocations(argv: list[str]) -> list[list[str]]:
    """The ``ledger`` argument lists a container runs (image entry point ``ledger``)."""
    if argv[:2] == ["/bin/sh", "-c"] or argv[:2] == ["sh", "-c"]:
        script = " ".join(argv[2:])
        calls = []
        for part in re.split(r";|&&|\|\||\bdo\b|\bthen\b", script):
            words = shlex.split(part)
            if words and words[0] == "ledger":
                calls.append(words[1:])
        assert calls, f"a shell command that runs no ledger command: {script!r}"
        return calls
    return [argv]


def _commands() -> list[tuple[str, list[str]]]:
    found = []
    for name, svc in _ledger_services().items():
        entry = svc.get("entrypoint")
        command = svc.get("command", [])
        command = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        argv = ([*entry] if entry else []) + command
        for call in _ledger_invocations(argv):
            found.append((f"compose {name}", call))
    for workload, _, c in _ledger_containers():
        assert "command" not in c, f"{workload}: keep the image's entry point (ledger)"
        found.append((f"k8s {workload}", [str(a) for a in c.get("args", [])]))
    for stage, lines in _dockerfile_stages():
        for body in _instruction(lines, "CMD"):
            found.append((f"Dockerfile {stage} CMD", json.loads(body)))
    return found


def _docs_commands() -> list[tuple[str, list[str]]]:
    """``ledger`` commands the "Deploying" page (docs/deploying.md) runs in a container."""
    page = (PROJECT_ROOT / "docs" / "deploying.md").read_text()
    found = []
    for line in page.replace("\\\n", " ").splitlines():
        words = shlex.split(line) if line.startswith("docker ") else []
        if words[:2] == ["docker", "compose"] and "cli" in words:
            found.append(("docs/deploying.md", words[words.index("cli") + 1 :]))
        elif words[:2] == ["docker", "run"]:
            image = next(i for i, w in enumerate(words) if w.startswith(IMAGE))
            found.append(("docs/deploying.md", words[image + 1 :]))
    assert len(found) >= 5, found
    return found


def _resolve(argv: list[str]) -> tuple[list[str], click.Command, list[str]]:
    """Walk the ``ledger`` group: (command path, the command, the arguments left)."""
    command: click.Command = ledger_cli
    path: list[str] = []
    rest = list(argv)
    ctx = click.Context(ledger_cli)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(ctx, rest[0])
        assert sub is not None, f"'ledger {' '.join(path + rest[:1])}' is no ledger command"
        path.append(rest.pop(0))
        command = sub
    return path, command, rest


@pytest.mark.parametrize(
    "where, argv", _commands() + _docs_commands(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_every_command_is_a_ledger_command(where: str, argv: list[str]) -> None:
    path, command, rest = _resolve(argv)
    result = CliRunner().invoke(ledger_cli, [*path, "--help"])
    assert result.exit_code == 0, f"{where}: ledger {' '.join(path)} --help: {result.output}"
    if not path:
        assert rest == ["--help"], f"{where}: the bare image prints the commands: {argv}"
    elif "--help" not in rest:
        # The arguments parse as that command takes them (nothing is run).
        command.make_context(command.name or path[-1], list(rest))


def test_the_stages_run_as_commands_of_their_own() -> None:
    compose = _ledger_services()
    for stage in STAGES:
        assert _resolve(compose[stage]["command"])[0] == [stage]


def test_the_command_checker_refuses_what_is_no_command() -> None:
    with pytest.raises(AssertionError, match="no ledger command"):
        _resolve(["relays"])
    with pytest.raises(AssertionError, match="no ledger command"):
        _resolve(["topics", "destroy"])
    _, command, rest = _resolve(["sink", "serve", "payments", "--port", "not-a-port"])
    with pytest.raises(click.BadParameter):
        command.make_context("serve", rest)


def test_the_image_entry_point_is_a_console_script_of_the_wheel() -> None:
    scripts = PYPROJECT["project"]["scripts"]
    stages = _dockerfile_stages()
    finals = {name: lines for name, lines in stages if _instruction(lines, "ENTRYPOINT")}
    assert finals, "the Dockerfile sets an entry point"
    for name, lines in finals.items():
        (entry,) = _instruction(lines, "ENTRYPOINT")
        argv = json.loads(entry)  # exec form: signals reach the stage, not a shell
        assert argv[0] in scripts, f"{name}: entry point {argv[0]!r} not in {sorted(scripts)}"
    # The wheel is built from every package the project ships, and its readme.
    (build_lines,) = [lines for name, lines in stages if name == "build"]
    copied = " ".join(_instruction(build_lines, "COPY"))
    for package in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert re.search(rf"\b{package.rstrip('*')}\b", copied), package
    assert "README.md" in copied and "pyproject.toml" in copied


def test_the_production_image_is_the_default_target_without_testbed_extras() -> None:
    stages = _dockerfile_stages()
    name, lines = stages[-1]  # `docker build .` builds the last stage
    assert name == "stages"
    install = " ".join(line for line in lines if "pip install" in line)
    assert "kafka_recovery_ledger" in install
    extras = re.findall(r"\[([a-z,-]+)\]", install.split("whl", 1)[1])
    assert extras == ["console,otlp,postgres"], extras  # what a stage may need; no testbed
    assert _instruction(lines, "USER") and not _instruction(lines, "USER")[-1].startswith(
        ("0", "root")
    )
    (sink_lines,) = [lines for n, lines in stages if n == "sink"]
    assert "testbed" not in install, "the production image installs no testbed"
    assert any("kafka_recovery_ledger_testbed-" in line for line in sink_lines), (
        "only the sink target installs the testbed's wheel"
    )
    assert not _instruction(sink_lines, "USER")[-1].startswith(("0", "root"))


def _listeners(value: str) -> dict[str, tuple[str, int]]:
    out = {}
    for item in value.split(","):
        name, _, hostport = item.partition("://")
        host, _, port = hostport.rpartition(":")
        out[name] = (host.strip("[]"), int(port))
    return out


def test_the_broker_advertises_its_in_network_listener_by_service_name() -> None:
    services = _compose()["services"]
    kafka = services["kafka"]
    env = _env(kafka["environment"])
    bound = _listeners(env["KAFKA_LISTENERS"])
    advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    internal = env["KAFKA_INTER_BROKER_LISTENER_NAME"]
    host, port = advertised[internal]
    assert host not in LOOPBACK, f"containers cannot reach {host}:{port}"
    assert host in {"kafka", kafka.get("hostname")}
    assert bound[internal][1] == port
    # The host's listener is the one published on 127.0.0.1.
    published = {p.rsplit(":", 1)[-1]: p for p in kafka["ports"]}
    external = [n for n, (h, _) in advertised.items() if h in LOOPBACK]
    assert len(external) == 1
    ext_port = advertised[external[0]][1]
    assert published[str(ext_port)].startswith("127.0.0.1:")
    # Every ledger container goes to the in-network listener.
    for name, svc in _ledger_services().items():
        bootstrap = _env(svc.get("environment")).get("LEDGER_BOOTSTRAP_SERVERS")
        assert bootstrap == f"{host}:{port}", name
    # The controller quorum names a host the broker resolves in the network.
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"]
    assert voters.split("@", 1)[1].split(":")[0] not in {"127.0.0.1", "0.0.0.0"}


def test_the_checker_refuses_a_loopback_advertised_listener() -> None:
    advertised = _listeners("PLAINTEXT://127.0.0.1:19092")
    assert advertised["PLAINTEXT"][0] in LOOPBACK


def test_every_compose_ledger_container_shares_the_keys() -> None:
    volumes = _compose().get("volumes", {})
    for name, svc in _ledger_services().items():
        env = _env(svc.get("environment"))
        keys = Path(env["LEDGER_KEYS_DIR"])
        mounts = [str(v).split(":") for v in svc.get("volumes", [])]
        holding = [src for src, target, *_ in mounts if keys.is_relative_to(target)]
        assert holding, f"{name}: nothing mounted on {keys}"
        assert set(holding) <= set(volumes), f"{name}: keys in a named volume, shared"
    sources = {str(v).split(":")[0] for svc in _ledger_services().values() for v in svc["volumes"]}
    assert len(sources) == 1


def _mounts(spec: dict[str, Any], container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    return {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])}


def test_kubernetes_stages_are_statefulsets_whose_ordinal_is_the_instance() -> None:
    sets = {doc["metadata"]["name"]: doc for doc in _kind("StatefulSet")}
    services = {doc["metadata"]["name"] for doc in _kind("Service")}
    by_stage = {}
    for name, doc in sets.items():
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        by_stage[container["args"][0]] = (name, doc, container)
    assert set(by_stage) == set(STAGES)
    for name, doc, container in by_stage.values():
        assert doc["spec"]["serviceName"] in services
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()
        # LEDGER_INSTANCE would override the ordinal: every pod the same identity.
        assert "LEDGER_INSTANCE" not in _container_env(container), name
        for ordinal in range(max(doc["spec"]["replicas"], 2)):
            assert resolve_instance(None, None, f"{name}-{ordinal}")[0] == str(ordinal)
        assert doc["spec"]["replicas"] <= int(_container_env(container)["LEDGER_PARTITIONS"])
        assert container["resources"]["requests"] and container["resources"]["limits"]
        # The probes ask the stage's own endpoints, on the port it serves them on.
        env = _container_env(container)
        (port,) = container["ports"]
        assert port["containerPort"] == int(env["LEDGER_METRICS_PORT"]), name
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
        annotations = doc["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == env["LEDGER_METRICS_PORT"], name


def test_kubernetes_client_config_and_keys_come_from_secrets() -> None:
    secrets = {doc["metadata"]["name"]: doc for doc in _kind("Secret")}
    for workload, spec, container in _ledger_containers():
        env = _container_env(container)
        mounts = _mounts(spec, container)
        config = Path(env["LEDGER_KAFKA_CONFIG_FILE"])
        volume = mounts[str(config.parent)]
        name = volume["secret"]["secretName"]
        assert name in secrets, f"{workload}: the client config Secret {name} is in the example"
        assert config.name in secrets[name]["stringData"]
        # It is a file the ledger reads as Kafka's tools do.
        assert "bootstrap.servers" in secrets[name]["stringData"][config.name]
        args = container.get("args", [])
        if (args and args[0] in STAGES) or args[:2] == ["reconcile", "run"]:
            keys = mounts[env["LEDGER_KEYS_DIR"]]
            # One Secret per role: a pod mounts its own role's private key only.
            role = "reconciler" if args[:2] == ["reconcile", "run"] else args[0]
            wanted = f"ledger-keys-{role}"
            assert keys["secret"]["secretName"] == wanted, workload
            assert str(Path(env["LEDGER_SINKS_FILE"]).parent) in mounts
        # The run folder is writable; the image runs as its non-root user.
        assert "emptyDir" in mounts[env["LEDGER_RUN_DIR"]]
        assert spec["securityContext"]["runAsNonRoot"] is True
