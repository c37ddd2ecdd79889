"""platform/compose.yaml (and its GPU overrides): valid under the official Compose Specification
schema, its services the Procfile's processes beside the backing stores and one-shot jobs, every
reference resolvable, every setting one that Strop or vLLM reads, a health check on every service
that keeps running, secrets only from the env file, Redis behind a password, every container
without capabilities or a way to gain them, and no volume that holds the repository or adapters.
Compose itself never runs here (no container engine): the schema and these rules are it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from config.secret_keys import SECRETS as CHECKED_SECRETS
from config.secret_keys import weakness
from tests.deploy.layout import (
    BACKING_SERVICES,
    COMPOSE,
    COMPOSE_ENV_EXAMPLE,
    COMPOSE_GPU,
    COMPOSE_ONE_GPU,
    COMPOSE_OVERRIDES,
    DOCKER,
    ON_DEMAND,
    ONE_SHOTS,
    ROOT,
    compose,
    dockerfile_stages,
    merged_services,
    procfile,
    pyproject_version,
    tool,
)
from tests.test_env_example import LISTED, settings_read

# Named volumes and who may write them: the databases', the object store's, and the base models'
# (written by the base-model job only, read-only everywhere else). None holds adapters.
VOLUME_WRITERS = {
    "postgres-data": {"postgres"},
    "redis-data": {"redis"},
    "object-store-data": {"object-store"},
    "models": {"base-model"},
}
# Values that must never be written in the compose file itself.
SECRETS = {
    "SECRET_KEY",
    "API_KEY_PEPPER",
    "ERASURE_MARK_KEY",
    "STORED_SECRETS_KEY",
    "VLLM_API_KEY",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "POSTGRES_PASSWORD",
    "MINIO_ROOT_USER",
    "MINIO_ROOT_PASSWORD",
    "STROP_METRICS_TOKEN",
    "STROP_STORE_READER_SECRET",
    "STROP_STORE_WRITER_SECRET",
    "REDIS_PASSWORD",
    "REDISCLI_AUTH",
    "EMAIL_HOST_PASSWORD",
}
# The object store's root key is read from this file, by these services only.
STORE_ROOT_ENV = {"path": "store-root.env", "required": True}
STORE_ROOT_READERS = {"object-store", "store-init", "store-users"}
# What the official images' entrypoints need, as root, before they drop to their own user: fix the
# data folder's ownership and switch user. Everything else runs with no capability at all.
CAPABILITIES = {
    "postgres": {"CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"},
    "redis": {"CHOWN", "SETGID", "SETUID"},
}
REDIS_PASSWORD = "${REDIS_PASSWORD:?"
# The on-demand copies of the adapter bucket, each with the one key its direction needs.
STORE_COPIERS = {"READER": ("store-backup",), "WRITER": ("store-restore",)}
BLANKED_STORE_KEYS = {f"STROP_STORE_{role}_{part}" for role in ("READER", "WRITER") for part in ("KEY_ID", "SECRET")}


@pytest.fixture(scope="module")
def services() -> dict[str, dict]:
    return compose()["services"]


def built_from_our_images(services: dict[str, dict]) -> dict[str, dict]:
    return {name: s for name, s in services.items() if "build" in s}


def vllm_documented() -> set[str]:
    """What platform/vllm.sh documents in its header and the vLLM plugins read from the environment."""
    script = (ROOT / "platform" / "vllm.sh").read_text().splitlines()
    names = {n for line in script if line.startswith("#") for n in re.findall(r"\b(VLLM_[A-Z0-9_]+)\b", line)}
    for plugin in (ROOT / "platform" / "vllm_plugins").glob("*.py"):
        names |= set(re.findall(r"os\.environ(?:\.get)?[\[(]\s*[\"']([A-Z][A-Z0-9_]+)[\"']", plugin.read_text()))
    return names


def strop_settings() -> set[str]:
    """Every setting Strop reads: what config/ reads, and platform/env.example's list of them."""
    return settings_read() | set(LISTED.findall((ROOT / "platform" / "env.example").read_text()))


def procfile_variables() -> set[str]:
    return {name for line in procfile().values() for name in re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", line)}


def interpolated(path: Path = COMPOSE) -> dict[str, bool]:
    """The variables compose fills into a file: name -> whether it is required (``${NAME:?...}``)."""
    found: dict[str, bool] = {}
    for name, operator in re.findall(r"(?<!\$)\$\{([A-Z_][A-Z0-9_]*)(:?[-?]?)", path.read_text()):
        found[name] = found.get(name, False) or operator == ":?"
    return found


def env_example_names() -> dict[str, str]:
    values = {}
    for line in COMPOSE_ENV_EXAMPLE.read_text().splitlines():
        match = re.match(r"^#?\s?([A-Z][A-Z0-9_]+)=(.*)$", line)
        if match:
            values[match.group(1)] = match.group(2)
    return values


def test_the_compose_files_are_valid_compose_specification_documents():
    """Against the Compose Specification's own JSON schema, as check-jsonschema ships it (no network)."""
    done = subprocess.run(
        [
            tool("check-jsonschema", "check-jsonschema"),
            "--builtin-schema",
            "vendor.compose-spec",
            str(COMPOSE),
            *map(str, COMPOSE_OVERRIDES),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_build_context_and_dockerfile_exists():
    for path in (COMPOSE, *COMPOSE_OVERRIDES):
        for name, service in compose(path)["services"].items():
            build = service.get("build")
            if build and "context" in build:
                context = (COMPOSE.parent / build["context"]).resolve()  # relative to the first file's folder
                assert context == ROOT, f"{name}: the build context is the repository root"
                assert (context / build["dockerfile"]).is_file(), f"{name}: {build['dockerfile']} is missing"


def test_the_gpu_override_builds_the_cuda_variants_of_services_that_exist(services):
    override = compose(COMPOSE_GPU)["services"]
    assert set(override) <= set(services)
    assert override["vllm"]["build"]["args"] == {"VLLM_VARIANT": "cuda"}
    assert override["worker-gpu"]["build"]["args"] == {"TORCH_VARIANT": "cuda"}
    for service in override.values():
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert [d["capabilities"] for d in devices] == [["gpu"]]
    ids = [override[n]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for n in override]
    assert len({tuple(i) for i in ids}) == len(ids), "vLLM and the gpu worker get GPUs of their own"


def test_the_one_gpu_override_shares_gpu_0_and_caps_vllm_so_the_trainer_fits(services):
    """One override file for a one-GPU host: the two-GPU file's CUDA builds, both services on device 0,
    and vLLM held to a share of the GPU's memory (its own default, 0.9, would leave the trainer ~10 %)."""
    one, two = compose(COMPOSE_ONE_GPU)["services"], compose(COMPOSE_GPU)["services"]
    assert set(one) == set(two) == {"vllm", "worker-gpu"}
    for name in one:
        devices = one[name]["deploy"]["resources"]["reservations"]["devices"]
        assert [(d["driver"], d["device_ids"], d["capabilities"]) for d in devices] == [("nvidia", ["0"], ["gpu"])]
        assert {k: v for k, v in one[name].items() if k not in {"deploy", "command"}} == {
            k: v for k, v in two[name].items() if k != "deploy"
        }, f"{name}: the same CUDA build as compose.gpu.yaml"
    merged = merged_services(COMPOSE_ONE_GPU)
    command = merged["vllm"]["command"]
    assert command[:2] == ["vllm", "--gpu-memory-utilization"], "the Procfile's vllm line, vLLM's argument appended"
    share = re.fullmatch(r"\$\{VLLM_GPU_MEMORY_UTILIZATION:-(0\.\d+)\}", command[2])
    assert share and 0.3 <= float(share.group(1)) <= 0.6, command
    assert merged["worker-gpu"]["command"] == ["worker-gpu"]
    script = [line for line in (ROOT / "platform" / "vllm.sh").read_text().splitlines() if not line.startswith("#")]
    assert not [line for line in script if "--gpu-memory-utilization" in line], "vllm.sh sets no second value"
    assert procfile()["vllm"].startswith("bash platform/vllm.sh ")
    assert script[-1].endswith('"${args[@]}" "$@"'), "vllm.sh passes extra arguments on to vLLM"


@pytest.mark.parametrize("override", COMPOSE_OVERRIDES, ids=lambda p: p.name)
def test_a_gpu_override_merged_into_the_base_keeps_every_service_and_its_rules(services, override):
    """Compose's merge of compose.yaml and the override (mappings merged, lists appended, a command
    replaced): the same services, each still hardened, with its store key and the base's settings."""
    merged = merged_services(override)
    assert set(merged) == set(services)
    for name in compose(override)["services"]:
        service = merged[name]
        assert service["security_opt"] == ["no-new-privileges:true"] and service["cap_drop"] == ["ALL"], name
        assert service["build"]["context"] == ".." and service["image"].endswith("-cuda"), name
        for kept in ("depends_on", "volumes", "healthcheck", "env_file"):
            assert service.get(kept) == services[name].get(kept), (name, kept)
        assert service["build"]["dockerfile"] == services[name]["build"]["dockerfile"], name
        assert set(services[name]["environment"]) <= set(service["environment"]), name


def test_images_are_tagged_by_release_with_pyprojects_version_as_the_default():
    version = pyproject_version()
    for path in (COMPOSE, *COMPOSE_OVERRIDES):
        for name, service in compose(path)["services"].items():
            if "build" not in service:
                continue
            args = service["build"]["args"]
            variant = args.get("TORCH_VARIANT") or args.get("VLLM_VARIANT")
            image = "strop-vllm" if "VLLM_VARIANT" in args else "strop-app"
            assert service["image"] == f"{image}:${{STROP_VERSION:-{version}}}-{variant}", (path.name, name)
    assert "STROP_VERSION" in env_example_names(), "compose.env.example says how to pin or roll back"


def test_every_dependency_names_a_service(services):
    for name, service in services.items():
        depends = service.get("depends_on", {})
        assert set(depends) <= set(services) - {name}, f"{name} depends on {sorted(set(depends) - set(services))}"
        for dependency, how in depends.items():
            wanted = "service_completed_successfully" if dependency in ONE_SHOTS else "service_healthy"
            assert how["condition"] == wanted, f"{name} -> {dependency}"


def test_the_services_are_the_procfiles_processes_beside_the_stores_and_one_shot_jobs(services):
    processes = procfile()
    assert set(services) == set(processes) | BACKING_SERVICES | ONE_SHOTS | ON_DEMAND
    for process in processes:
        assert services[process]["command"] == [process], f"{process} runs its Procfile line (entrypoint.sh)"


def test_one_shot_jobs_run_once_and_everything_else_keeps_running_with_a_health_check(services):
    for name, service in services.items():
        if name in ONE_SHOTS | ON_DEMAND:
            assert service["restart"] == "no"
            assert service["healthcheck"] == {"disable": True}, f"{name} serves nothing to check"
            assert ("profiles" in service) == (name in ON_DEMAND), f"{name}: `up` starts it only if it is not on demand"
        else:
            assert service["restart"] == "unless-stopped"
            assert service["healthcheck"]["test"][0] in {"CMD", "CMD-SHELL"}, name


def test_each_worker_health_check_pings_the_node_name_its_procfile_line_gives(services):
    for process, line in procfile().items():
        node = re.search(r"-n (\S+)@%h", line)
        if " worker " not in line:
            continue
        assert node, f"{process} has a node name"
        check = " ".join(services[process]["healthcheck"]["test"])
        assert f"--destination {node.group(1)}@$$HOSTNAME" in check, process


def test_the_api_is_checked_for_readiness_and_published_where_the_image_listens(services):
    api = services["api"]
    assert api["healthcheck"]["test"][-1] == "/health/ready"
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(dockerfile_stages(DOCKER / "app.Dockerfile")[-1].all("ENV"))))
    assert [p.rpartition(":")[2] for p in api["ports"]] == [env["API_BIND"].rpartition(":")[2]]


def test_the_api_counts_sign_in_failures_by_the_address_its_proxy_saw(services):
    """The API is published on loopback for a TLS proxy on the host: without a trusted hop every client
    shares the proxy's address, and five failures for any name would lock everyone out (issue 40)."""
    assert services["api"]["ports"][0].startswith("${API_PUBLISH:-127.0.0.1:")
    assert services["api"]["environment"]["STROP_TRUSTED_PROXY_HOPS"] == "${STROP_TRUSTED_PROXY_HOPS:-1}"


def test_strop_and_vllm_agree_on_the_adapter_store_limits_and_address(services):
    app, vllm = services["api"]["environment"], services["vllm"]["environment"]
    shared = ("STROP_ADAPTER_STORE", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "VLLM_MAX_LORA_RANK", "VLLM_MAX_LORAS")
    for name in (*shared, "VLLM_MODEL", "VLLM_SERVED_MODEL_NAME"):
        assert app[name] == vllm[name], name
    assert "s3://strop-adapters/adapters" in app["STROP_ADAPTER_STORE"]
    vllm_env = dict(re.findall(r"(\w+)=(\S+)", " ".join(dockerfile_stages(DOCKER / "vllm.Dockerfile")[-1].all("ENV"))))
    assert f"http://vllm:{vllm_env['VLLM_PORT']}" in app["VLLM_BASE_URLS"]
    for service in built_from_our_images(services).values():
        assert service["environment"]["STROP_ADAPTER_STORE"] == app["STROP_ADAPTER_STORE"]


def test_our_services_set_only_what_strop_or_vllm_reads(services):
    # compose.env reaches every Strop container: the store's raw keys are blanked there (each gets its
    # own as AWS_*), although Strop reads only the purger's.
    known = strop_settings() | vllm_documented() | procfile_variables() | BLANKED_STORE_KEYS
    for path in (COMPOSE, *COMPOSE_OVERRIDES):
        for name, service in compose(path)["services"].items():
            if name in built_from_our_images(services):
                unknown = set(service.get("environment", {})) - known
                assert not unknown, f"{name} sets {sorted(unknown)}, which nothing of Strop or vLLM reads"


def test_secrets_come_from_the_env_file_never_from_the_compose_file(services):
    assert all(
        [f for f in s["env_file"] if f != STORE_ROOT_ENV] == [{"path": "compose.env", "required": True}]
        for n, s in services.items()
        if n != "vllm" and "build" in s
    )
    for name, service in services.items():
        for variable, value in (service.get("environment") or {}).items():
            if variable in SECRETS and value != "":  # "" blanks what compose.env would hand over
                assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]+\}", str(value)), f"{name}: {variable} is written in the file"


def test_no_service_mounts_the_repository_or_adapters(services):
    for name, service in services.items():
        for volume in service.get("volumes", []):
            assert isinstance(volume, str), f"{name}: short syntax only, so this check reads every mount"
            source, target, *mode = volume.split(":")
            assert source in VOLUME_WRITERS, f"{name} mounts {source}: only named volumes, no bind mounts"
            assert "adapter" not in target and not target.startswith("/app"), f"{name} mounts {target}"
            writes = mode != ["ro"]
            assert not writes or name in VOLUME_WRITERS[source], f"{name} may not write {source}"
    assert set(compose()["volumes"]) == set(VOLUME_WRITERS)


def test_the_env_file_example_holds_what_compose_requires_and_only_known_names():
    example = env_example_names()
    required = {name for name, needed in interpolated().items() if needed}
    assert required <= set(example), f"compose.env.example lacks {sorted(required - set(example))}"
    known = strop_settings() | vllm_documented() | {n for p in (COMPOSE, *COMPOSE_OVERRIDES) for n in interpolated(p)}
    assert set(example) <= known, f"nothing reads {sorted(set(example) - known)}"


def test_the_env_file_example_secrets_are_placeholders_strop_refuses():
    example = env_example_names()
    for name in ("SECRET_KEY", "API_KEY_PEPPER", "ERASURE_MARK_KEY", "STORED_SECRETS_KEY"):
        assert weakness(example[name]) is not None, name
    for name in (SECRETS - {"AWS_ACCESS_KEY_ID"}) & set(example):
        assert "change-me" in example[name], name
    password = example["POSTGRES_PASSWORD"]
    assert f":{password}@postgres:5432/" in example["DATABASE_URL"], "one password for postgres and Strop"


def test_no_strop_container_or_vllm_replica_holds_the_object_stores_root_key(services):
    """Root only in the object store and its one-shot jobs; vLLM and every Strop process read the
    bucket with the read-only key, the gpu worker (the trainer) writes with the writing one."""
    example = env_example_names()
    assert not {"MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(example)
    root_example = (COMPOSE.parent / "store-root.env.example").read_text()
    assert "MINIO_ROOT_USER=" in root_example and "MINIO_ROOT_PASSWORD=change-me" in root_example
    assert services["object-store"]["env_file"] == [STORE_ROOT_ENV]
    assert "environment" not in services["object-store"], "its root key comes from store-root.env alone"
    for name, service in services.items():
        environment = service.get("environment") or {}
        if name not in STORE_ROOT_READERS:
            assert STORE_ROOT_ENV not in (service.get("env_file") or []), name
            assert not {"MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"} & set(environment), name
        if name in STORE_ROOT_READERS or "build" not in service:
            continue
        role = "WRITER" if name == "worker-gpu" else "READER"
        assert environment["AWS_ACCESS_KEY_ID"].startswith(f"${{STROP_STORE_{role}_KEY_ID:?"), name
        assert environment["AWS_SECRET_ACCESS_KEY"].startswith(f"${{STROP_STORE_{role}_SECRET:?"), name
    for path in (COMPOSE, *COMPOSE_OVERRIDES):  # no override hands a service another key
        text = path.read_text()
        assert "${AWS_ACCESS_KEY_ID" not in text and "${AWS_SECRET_ACCESS_KEY" not in text, path.name


def test_the_store_keys_policies_let_the_reader_get_the_writer_put_and_only_the_purger_delete(services):
    script = "\n".join(services["store-users"]["command"])
    reader = re.search(r"printf '(.+)' .* > /tmp/reader.json", script)
    writer = re.search(r"printf '(.+)' .* > /tmp/writer.json", script)
    purger = re.search(r"printf '(.+)' .* > /tmp/purger.json", script)
    assert reader and writer and purger
    assert '"s3:GetObject"]' in reader.group(1) and "PutObject" not in reader.group(1)
    assert '"s3:GetObject", "s3:PutObject"]' in writer.group(1)
    assert "Delete" not in reader.group(1) + writer.group(1) and "s3:*" not in script
    assert '"s3:DeleteObject", "s3:DeleteObjectVersion"]' in purger.group(1)
    assert "GetObject" not in purger.group(1) and "PutObject" not in purger.group(1)
    for role in ("READER", "WRITER", "PURGE"):
        holders = {
            name for name, s in services.items() if (s.get("environment") or {}).get(f"STROP_STORE_{role}_SECRET")
        }
        expected = {"store-users", *STORE_COPIERS.get(role, ()), *(["api"] if role == "PURGE" else [])}
        assert holders == expected, role  # any other container that loads compose.env has it blanked
        for name, service in services.items():
            loads_compose_env = {"path": "compose.env", "required": True} in (service.get("env_file") or [])
            if loads_compose_env and name not in expected:
                assert service["environment"][f"STROP_STORE_{role}_SECRET"] == "", (name, role)
    assert services["api"]["environment"]["AWS_ACCESS_KEY_ID"].startswith("${STROP_STORE_READER_KEY_ID:?")
    assert services["store-users"]["depends_on"] == {"store-init": {"condition": "service_completed_successfully"}}
    for name in ("vllm", "api", "worker-gpu"):
        assert "store-users" in services[name]["depends_on"], name


def test_every_container_drops_every_capability_and_cannot_gain_privileges(services):
    for path in COMPOSE_OVERRIDES:
        for name, service in compose(path)["services"].items():  # GPUs need no capability
            assert not {"privileged", "cap_add", "cap_drop", "security_opt", "user"} & set(service), name
    for name, service in services.items():
        assert service["security_opt"] == ["no-new-privileges:true"], name
        assert service["cap_drop"] == ["ALL"], name
        assert set(service.get("cap_add", [])) == CAPABILITIES.get(name, set()), name
        assert not service.get("privileged") and "user" not in service, name  # the images' own users


def test_redis_requires_a_password_that_every_client_url_carries(services):
    redis = services["redis"]
    command = redis["command"]
    assert command[0] == "redis-server", "the image's entrypoint drops to the redis user only for redis-server"
    assert command[command.index("--requirepass") + 1].startswith(REDIS_PASSWORD)
    assert redis["environment"]["REDISCLI_AUTH"].startswith(REDIS_PASSWORD)  # the health check's redis-cli
    clients = 0
    for name, service in services.items():
        for variable, value in (service.get("environment") or {}).items():
            if variable.endswith(("REDIS_URL", "BROKER_URL")):
                assert str(value).startswith(f"redis://:{REDIS_PASSWORD}"), f"{name}: {variable}"
                clients += 1
    assert clients >= len(procfile()) - 1  # every Strop process (vLLM talks to no Redis)
    assert not {"REDIS_URL", "CELERY_BROKER_URL"} & set(env_example_names()), "compose.yaml sets the URL"


def test_every_secret_the_env_file_example_sets_is_one_strop_refuses():
    example = env_example_names()
    checked = [secret for secret in CHECKED_SECRETS if secret.setting in example]
    assert {"SECRET_KEY", "VLLM_API_KEY", "DATABASE_URL", "EMAIL_HOST_PASSWORD"} <= {s.setting for s in checked}
    for secret in checked:
        value = secret.value(example)
        assert value and weakness(value, secret.min_length) is not None, secret.label
    assert weakness(example["REDIS_PASSWORD"], 24) is not None


def store_copy_script(services: dict[str, dict], name: str) -> str:
    return "\n".join(services[name]["command"])


def test_the_store_backup_reads_the_bucket_with_the_reader_key_into_the_folder_it_is_given(services):
    """Reachable from the host with no published port: a one-off container on the stack's network,
    the object store's image (its mc), the reader key (list and get), copying into /backup, a host
    folder mounted at run time; it deletes nothing, in the bucket or the folder."""
    backup, restore = store_copy_script(services, "store-backup"), store_copy_script(services, "store-restore")
    assert services["store-backup"]["image"] == services["object-store"]["image"]
    alias = 'alias set store http://object-store:9000 "$$STROP_STORE_{0}_KEY_ID" "$$STROP_STORE_{0}_SECRET"'
    assert alias.format("READER") in backup and alias.format("WRITER") in restore
    assert re.search(r'mc --config-dir /tmp/mc mirror store/"\$\$bucket" /backup\n', backup)
    assert re.search(r'mc --config-dir /tmp/mc mirror /backup store/"\$\$bucket"\n', restore)
    for name, script in (("store-backup", backup), ("store-restore", restore)):
        assert "--remove" not in script and " rm " not in script and "--overwrite" not in script, name
        assert "MINIO_ROOT" not in script and "env_file" not in services[name], f"{name} holds no root key"
        assert services[name]["depends_on"] == {"store-users": {"condition": "service_completed_successfully"}}
        assert services[name]["profiles"] == ["store"] and "volumes" not in services[name]
