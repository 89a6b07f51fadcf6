import ipaddress

from django.core.exceptions import ValidationError


def validate_networks(value: object) -> None:
    """Accept a list of CIDR strings (IPv4 or IPv6)."""
    if not isinstance(value, list):
        raise ValidationError('Enter a list of networks, e.g. ["10.0.0.0/8"].')
    for item in value:
        try:
            ipaddress.ip_network(item, strict=False)
        except (TypeError, ValueError) as exc:
            raise ValidationError(f"{item!r} is not a network in CIDR form.") from exc
