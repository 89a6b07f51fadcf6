"""Hardware profiles in the database: the loader, operators' prices, the command, registration."""

import shutil
from decimal import Decimal
from io import StringIO

import pytest
import yaml
from asgiref.sync import async_to_sync
from django.contrib.admin.sites import site
from django.core.management import CommandError, call_command
from django.test import RequestFactory

from apps.hardware.models import HardwareProfile
from apps.hardware.nodestate import NodeSnapshot, fleet_key
from apps.hardware.profiles import profile_fields
from apps.hardware.services import (
    hardware_profile_update,
    hardware_profiles_load,
    node_heartbeat_record,
    node_register,
    node_token_authenticate,
)
from dmxplatform.redis_client import async_redis, sync_redis
from inference.hardware.detection import get_gpu_info
from inference.hardware.profiles import PROFILES_DIR, load_profiles
from inference.wire import Heartbeat, Registration
from tests.hardware.factories import make_node_token
from tests.inference.hardware.nvml_replay import H100_X8, replay
from tests.models.factories import make_model

pytestmark = pytest.mark.django_db


@pytest.fixture
def files(tmp_path):
    """A copy of the profile files a test may edit."""
    directory = tmp_path / "profiles"
    shutil.copytree(PROFILES_DIR, directory)

    def edit(name: str, **changes) -> None:
        path = directory / f"{name}.yaml"
        data = yaml.safe_load(path.read_text())
        path.write_text(yaml.safe_dump({**data, **changes}))

    edit.directory = directory
    return edit


def test_a_fresh_database_has_every_profile_file():
    stored = {profile.name: profile for profile in HardwareProfile.objects.all()}
    for profile in load_profiles():
        row = stored[profile.name]
        for name, value in profile_fields(profile).items():
            assert getattr(row, name) == value, (profile.name, name)


def test_loading_is_idempotent():
    names = {profile.name for profile in load_profiles()}
    first = hardware_profiles_load()  # the migration loaded them already
    assert (first.created, first.updated, set(first.unchanged)) == ([], [], names)
    HardwareProfile.objects.filter(name="nvidia-l4").delete()
    HardwareProfile.objects.filter(name="nvidia-t4").update(memory_bandwidth_gbps=3.2)
    second = hardware_profiles_load()
    assert (second.created, second.updated) == (["nvidia-l4"], ["nvidia-t4"])
    assert HardwareProfile.objects.get(name="nvidia-t4").memory_bandwidth_gbps == 320
    third = hardware_profiles_load()
    assert (third.created, third.updated, len(third.unchanged)) == ([], [], len(names))


def test_an_operators_price_survives_a_load(files):
    h100 = HardwareProfile.objects.get(name="nvidia-h100-sxm")
    h100.hourly_price_usd = Decimal("2.1")
    hardware_profile_update(profile=h100, price_changed=True)
    files("nvidia-h100-sxm", hourly_price_usd=3.5, tdp_watts=690)
    files("nvidia-h200-sxm", hourly_price_usd=4.25)

    loaded = hardware_profiles_load(directory=files.directory)

    assert set(loaded.updated) == {"nvidia-h100-sxm", "nvidia-h200-sxm"}
    h100.refresh_from_db()
    assert (h100.hourly_price_usd, h100.price_overridden) == (Decimal("2.1"), True)
    assert h100.tdp_watts == 690  # the facts still follow the files
    h200 = HardwareProfile.objects.get(name="nvidia-h200-sxm")
    assert (h200.hourly_price_usd, h200.price_overridden) == (Decimal("4.25"), False)
    # Clearing the flag hands the price back to the files.
    h100.price_overridden = False
    hardware_profile_update(profile=h100, price_changed=False)
    hardware_profiles_load(directory=files.directory)
    h100.refresh_from_db()
    assert h100.hourly_price_usd == Decimal("3.5")


def test_the_admin_marks_a_changed_price_as_the_operators(admin_user):
    profile = HardwareProfile.objects.get(name="nvidia-a10g")
    model_admin = site._registry[HardwareProfile]
    request = RequestFactory().post("/")
    request.user = admin_user
    form_class = model_admin.get_form(request, profile, change=True)
    data = {
        name: field.prepare_value(form_class(instance=profile).initial.get(name))
        for name, field in form_class.base_fields.items()
    }
    data["price_overridden"] = ""  # unchecked
    untouched = form_class(data=data, instance=profile)
    assert untouched.is_valid(), untouched.errors
    model_admin.save_model(request, untouched.save(commit=False), untouched, change=True)
    assert not HardwareProfile.objects.get(name="nvidia-a10g").price_overridden
    changed = form_class(data={**data, "hourly_price_usd": "0.95"}, instance=profile)
    assert changed.is_valid(), changed.errors
    model_admin.save_model(request, changed.save(commit=False), changed, change=True)
    stored = HardwareProfile.objects.get(name="nvidia-a10g")
    assert (stored.hourly_price_usd, stored.price_overridden) == (Decimal("0.95"), True)


def run(*args: str) -> str:
    out = StringIO()
    call_command("hardware_profiles", *args, stdout=out)
    return out.getvalue()


def test_command_lists_the_profiles():
    HardwareProfile.objects.filter(name="nvidia-t4").update(
        hourly_price_usd=Decimal("0.3"), price_overridden=True
    )
    lines = run().splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert set(rows) == set(HardwareProfile.objects.values_list("name", flat=True))
    h200 = HardwareProfile.objects.get(name="nvidia-h200-sxm")
    assert rows["nvidia-h200-sxm"][1:3] == [
        f"{h200.memory_gb:g}",
        f"{h200.memory_bandwidth_gbps:g}",
    ]
    assert rows["nvidia-t4"][-1] == "0.30*" and rows["cpu"][1] == "-"


def test_command_loads():
    HardwareProfile.objects.filter(name="nvidia-b200").delete()
    output = run("--load")
    assert "created: nvidia-b200" in output and "updated: none" in output


def test_command_shows_which_profile_a_gpu_maps_to():
    output = run("--match", "NVIDIA H100 80GB HBM3", "--memory-mb", "81559", "--cc", "9.0")
    price = HardwareProfile.objects.get(name="nvidia-h100-sxm").hourly_price_usd
    assert "-> profile nvidia-h100-sxm" in output and f"{price:.2f} USD/h" in output
    # An H200's memory under an H100's name is not an H100.
    output = run("--match", "NVIDIA H100 80GB HBM3", "--memory-mb", "143771", "--cc", "9.0")
    assert "generic profile" in output and "name matches nvidia-h100-sxm" in output
    with pytest.raises(CommandError, match="--memory-mb and --cc"):
        run("--match", "NVIDIA H200")


@pytest.fixture
def registered(private_redis, django_capture_on_commit_callbacks):
    """Register a node with the recorded 8 x H100 view; return a function to do it again."""
    make_model("unit-hw")
    _, plaintext = make_node_token()
    token = node_token_authenticate(plaintext=plaintext)
    view = get_gpu_info(backend=replay(H100_X8)).to_dict()

    def register():
        registration = Registration(
            name="unit-hgx",
            url="http://127.0.0.1:1",
            model="unit-hw",
            version="v1",
            served_model_name="unit-hw",
            max_model_len=8192,
            resources=view,
        )
        with django_capture_on_commit_callbacks(execute=True):
            node, _ = node_register(token=token, registration=registration)
        return node, NodeSnapshot.decode(sync_redis().hget(fleet_key(), str(node.id)))

    register.token = token
    register.view = view
    return register


def test_registration_links_the_profile_and_prices_the_node_from_the_database(registered):
    node, snapshot = registered()
    assert node.profile.name == "nvidia-h100-sxm" and snapshot.profile == "nvidia-h100-sxm"
    assert snapshot.gpu_count == 8
    assert snapshot.hourly_price_usd == round(8 * float(node.profile.hourly_price_usd), 4)
    profile = node.profile
    profile.hourly_price_usd = Decimal("2.5")
    hardware_profile_update(profile=profile, price_changed=True)
    node, snapshot = registered()
    assert snapshot.hourly_price_usd == 20.0  # 8 GPUs at the operator's 2.50
    heartbeat = Heartbeat(status="up", resources=registered.view)
    after = async_to_sync(node_heartbeat_record)(
        redis=async_redis(), token=registered.token, node_id=node.id, heartbeat=heartbeat
    )
    assert after.hourly_price_usd == 20.0 and after.temperature_c > 0
