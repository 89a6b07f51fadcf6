"""POST /internal/v1/alerts/alertmanager: Alertmanager's webhook, in its version 4 payload."""

import pytest

from apps.routing.choices import ScalingAction, ScalingTrigger
from apps.routing.models import ScalingEvent
from tests.routing.scaling.factories import NAMESPACE, make_policy, publish_node

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]

URL = "/internal/v1/alerts/alertmanager"
TOKEN = "am-secret-4f1c"
MODEL = "unit-alerted"


@pytest.fixture
def token(settings) -> str:
    settings.DMX_ALERTMANAGER_TOKEN = TOKEN
    return TOKEN


def alert(status: str, *, model: str | None = MODEL, name: str = "DmxLatencyHigh") -> dict:
    labels = {"alertname": name, "severity": "page"}
    if model:
        labels["model"] = model
    return {
        "status": status,
        "labels": labels,
        "annotations": {"summary": f"P95 latency of {model} over its SLO"},
        # Alertmanager writes RFC 3339 with nanoseconds, and the zero time for "not ended".
        "startsAt": "2026-11-29T09:12:44.123456789Z",
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-29T09:20:01.5Z",
        "generatorURL": "http://prometheus:9090/graph?g0.expr=dmx_latency",
        "fingerprint": "c5a5ee8a1b1e3e48",
    }


def notification(*alerts: dict) -> dict:
    return {
        "version": "4",
        "groupKey": '{}:{alertname="DmxLatencyHigh"}',
        "truncatedAlerts": 0,
        "status": "firing" if any(a["status"] == "firing" for a in alerts) else "resolved",
        "receiver": "dmx-autoscaler",
        "groupLabels": {"alertname": "DmxLatencyHigh"},
        "commonLabels": {"alertname": "DmxLatencyHigh"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
    }


def post(client, body, *, authorization: str | None = None):
    headers = {"HTTP_AUTHORIZATION": authorization} if authorization else {}
    return client.post(URL, data=body, content_type="application/json", **headers)


def assert_error(response, status: int, code: str) -> None:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code


def test_without_a_configured_token_the_webhook_is_off(client, settings):
    settings.DMX_ALERTMANAGER_TOKEN = None

    response = post(client, notification(alert("firing")), authorization="Bearer anything")

    assert_error(response, 503, "alertmanager_not_configured")


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"],
    ids=["missing", "wrong", "other-scheme", "longer", "empty"],
)
def test_a_missing_or_wrong_token_is_401_and_triggers_nothing(client, token, kube, authorization):
    kube.add(NAMESPACE, MODEL, replicas=1)
    make_policy(MODEL)

    response = post(client, notification(alert("firing")), authorization=authorization)

    assert_error(response, 401, "invalid_alertmanager_token")
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert TOKEN not in response.content.decode()
    assert not ScalingEvent.objects.exists()
    assert kube.patches() == []


def test_a_firing_alert_scales_the_model_out_at_once(client, token, kube):
    kube.add(NAMESPACE, MODEL, replicas=1)
    policy = make_policy(MODEL, breaches_to_scale_out=2)
    publish_node(MODEL, waiting=0)  # the platform's own figures say calm

    response = post(client, notification(alert("firing")), authorization=f"Bearer {TOKEN}")

    assert response.status_code == 200
    (outcome,) = response.json()["alerts"]
    assert outcome["outcome"] == "evaluated"
    assert (outcome["action"], outcome["from_replicas"], outcome["to_replicas"]) == (
        ScalingAction.SCALE_OUT,
        1,
        2,
    )
    assert kube.replicas(NAMESPACE, MODEL) == 2
    event = ScalingEvent.objects.get(pk=outcome["event_id"])
    assert (event.policy_id, event.trigger) == (policy.id, ScalingTrigger.ALERTMANAGER)
    assert "DmxLatencyHigh" in event.reason and event.figures["alert"] == "DmxLatencyHigh"


def test_several_alerts_about_one_model_scale_it_once(client, token, kube):
    kube.add(NAMESPACE, MODEL, replicas=1)
    make_policy(MODEL, cooldown_seconds=0)

    response = post(
        client,
        notification(alert("firing"), alert("firing", name="DmxQueueDeep")),
        authorization=f"Bearer {TOKEN}",
    )

    assert response.status_code == 200
    outcomes = response.json()["alerts"]
    assert {o["event_id"] for o in outcomes} == {outcomes[0]["event_id"]}
    assert kube.replicas(NAMESPACE, MODEL) == 2
    assert ScalingEvent.objects.count() == 1


def test_resolved_and_unrelated_alerts_are_recorded_or_ignored_without_scaling(client, token, kube):
    kube.add(NAMESPACE, MODEL, replicas=2)
    policy = make_policy(MODEL)

    response = post(
        client,
        notification(
            alert("resolved"),
            alert("firing", model=None, name="DiskFull"),
            alert("firing", model="unit-no-policy"),
        ),
        authorization=f"Bearer {TOKEN}",
    )

    assert response.status_code == 200
    resolved, unlabelled, unknown = response.json()["alerts"]
    assert (resolved["outcome"], resolved["action"]) == ("recorded", ScalingAction.HOLD)
    assert (unlabelled["outcome"], unknown["outcome"]) == ("ignored", "ignored")
    event = ScalingEvent.objects.get(policy=policy)
    assert (event.from_replicas, event.to_replicas) == (2, 2)
    assert "resolved" in event.reason
    assert kube.patches() == []
    policy.refresh_from_db()
    assert (policy.consecutive_breaches, policy.consecutive_calm) == (0, 0)


def test_a_firing_alert_at_max_replicas_is_recorded_as_a_hold(client, token, kube):
    kube.add(NAMESPACE, MODEL, replicas=2)
    make_policy(MODEL, max_replicas=2)

    response = post(client, notification(alert("firing")), authorization=f"Bearer {TOKEN}")

    (outcome,) = response.json()["alerts"]
    assert (outcome["action"], outcome["to_replicas"]) == (ScalingAction.HOLD, 2)
    assert "max_replicas" in outcome["reason"]
    assert ScalingEvent.objects.filter(pk=outcome["event_id"]).exists()


def test_a_malformed_notification_is_400_in_openai_shape(client, token):
    response = post(
        client, {"version": "4", "alerts": [{"status": "burning"}]}, authorization=f"Bearer {TOKEN}"
    )

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"].startswith("alerts")
