"""Routing's internal API: Alertmanager's webhook, which can trigger scaling decisions."""

from __future__ import annotations

from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.routing.api.authentication import AlertmanagerTokenAuthentication
from apps.routing.scaling.services import AlertmanagerAlert, alertmanager_alerts_handle


class AlertmanagerWebhookView(APIView):
    """Take a notification as Alertmanager's webhook receiver sends it (payload version 4).

    A firing alert with a `model` label evaluates that model's scaling policy at once, counting
    as a breach; a resolved one is recorded. Answers 200 with one outcome per alert: a non-2xx
    would only make Alertmanager send the same notification again.
    """

    authentication_classes = [AlertmanagerTokenAuthentication]

    class InputSerializer(serializers.Serializer):
        class AlertSerializer(serializers.Serializer):
            status = serializers.ChoiceField(choices=["firing", "resolved"])
            labels = serializers.DictField(child=serializers.CharField(allow_blank=True))
            annotations = serializers.DictField(
                child=serializers.CharField(allow_blank=True), required=False, default=dict
            )
            startsAt = serializers.DateTimeField(required=False, allow_null=True)
            endsAt = serializers.DateTimeField(required=False, allow_null=True)

        version = serializers.CharField(required=False)
        receiver = serializers.CharField(required=False, allow_blank=True)
        status = serializers.ChoiceField(choices=["firing", "resolved"], required=False)
        alerts = AlertSerializer(many=True)

    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        alerts = [
            AlertmanagerAlert(
                status=alert["status"],
                labels=alert["labels"],
                annotations=alert["annotations"],
                starts_at=alert.get("startsAt"),
                ends_at=alert.get("endsAt"),
            )
            for alert in serializer.validated_data["alerts"]
        ]
        outcomes = alertmanager_alerts_handle(alerts=alerts)
        return Response({"received": len(alerts), "alerts": outcomes})
