"""FCM HTTP v1 message fields, checked as FCM's JSON-to-proto parser checks them.

FCM reads a request into its proto types before anything else: a field the type does not
have, a number where a string belongs, an enum name it does not know, a `ttl` that is not a
proto Duration (`"3.5s"`), a map value that is not a string, are each refused whole with 400
INVALID_ARGUMENT and a google.rpc.BadRequest field violation naming the field. Each field
takes its proto name or its lowerCamelCase JSON name (`collapse_key`, `collapseKey`); enum
names are matched without regard to case (firebase-admin sends `"high"` for HIGH) and their
numbers are taken too; null is an unset field.

Covered: the message's `notification` and `fcm_options`, and the platform blocks `android`
(AndroidConfig, AndroidNotification, LightSettings, AndroidFcmOptions), `apns` (ApnsConfig,
ApnsFcmOptions) and `webpush` (WebpushConfig, WebpushFcmOptions). `apns.payload` and
`webpush.notification` are free JSON objects (google.protobuf.Struct): only their being
objects is checked.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Collection
from typing import Any

from simulators.kinds import ErrorCase
from simulators.pipeline import Rejection

Check = Callable[[object, str], None]

_DURATION = re.compile(r"^-?(\d{1,12})(\.\d{1,9})?s\Z")
MAX_DURATION_S = 315_576_000_000  # google.protobuf.Duration's range, about 10,000 years
_TIMESTAMP = re.compile(
    r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
)
INT32 = range(-(2**31), 2**31)


def invalid(field_name: str, description: str) -> Rejection:
    return Rejection(ErrorCase.BAD_REQUEST, description, field_name=field_name)


def check_known(body: dict[str, Any], known: Collection[str], where: str | None) -> None:
    """Google's JSON-to-proto parser refuses a field the message type does not have, so a
    misspelt field is a 400 rather than silently ignored."""
    for name in body:
        if name not in known:
            at = f" at '{where}'" if where else ""
            raise invalid(
                where or "",
                f"Invalid JSON payload received. Unknown name {json.dumps(name)}{at}: "
                "Cannot find field.",
            )


def _bad_value(where: str, kind: str, value: object) -> Rejection:
    return invalid(where, f"Invalid value at '{where}' ({kind}), {json.dumps(value)}")


def string(value: object, where: str) -> None:
    if not isinstance(value, str):
        raise _bad_value(where, "TYPE_STRING", value)


def boolean(value: object, where: str) -> None:
    if not isinstance(value, bool):
        raise _bad_value(where, "TYPE_BOOL", value)


def int32(value: object, where: str) -> None:
    whole = _whole(value)
    if whole is None or whole not in INT32:
        raise _bad_value(where, "TYPE_INT32", value)


def _whole(value: object) -> int | None:
    """An integer as proto JSON takes one: a whole number, or a string of digits."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,10}", value):
        return int(value)
    return None


def number(value: object, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad_value(where, "TYPE_FLOAT", value)


def duration(value: object, where: str) -> None:
    """A google.protobuf.Duration in its JSON form: seconds with up to nine decimals and an
    `s` (`"3.5s"`, `"86400s"`), never a bare number."""
    found = _DURATION.match(value) if isinstance(value, str) else None
    if found is None or int(found.group(1)) > MAX_DURATION_S:
        raise _bad_value(where, "type.googleapis.com/google.protobuf.Duration", value)


def timestamp(value: object, where: str) -> None:
    """A google.protobuf.Timestamp in its JSON form, RFC 3339 with `Z` or an offset."""
    found = _TIMESTAMP.match(value) if isinstance(value, str) else None
    try:
        if found is None:
            raise ValueError("not RFC 3339")
        datetime.datetime.fromisoformat(found.group(1))
    except ValueError:
        raise _bad_value(where, "type.googleapis.com/google.protobuf.Timestamp", value) from None


def struct(value: object, where: str) -> None:
    if not isinstance(value, dict):
        raise _bad_value(where, "type.googleapis.com/google.protobuf.Struct", value)


def enum(type_name: str, *names: str) -> Check:
    """An enum field: one of ``names`` (any case), or its number, the position in ``names``."""
    known = {name.lower() for name in names}

    def check(value: object, where: str) -> None:
        if isinstance(value, str) and value.lower() in known:
            return
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
            return
        raise _bad_value(where, f"type.googleapis.com/{type_name}", value)

    return check


def repeated(item: Check) -> Check:
    def check(value: object, where: str) -> None:
        if not isinstance(value, list):
            # The proto JSON parser reads a lone value as a list of one.
            item(value, where)
            return
        for index, element in enumerate(value):
            item(element, f"{where}[{index}]")

    return check


def string_map(value: object, where: str) -> None:
    """A map<string, string>: FCM names a bad entry by its position, `data[0].value`."""
    if not isinstance(value, dict):
        raise invalid(where, f"Invalid value at '{where}' (map)")
    for index, entry in enumerate(value.values()):
        if not isinstance(entry, str):
            raise _bad_value(f"{where}[{index}].value", "TYPE_STRING", entry)


def message(type_name: str, fields: dict[str, Check]) -> Check:
    """A proto message: a JSON object with only ``fields`` (by their proto names), each
    checked when it is set."""
    by_spelling = {spelling: check for name, check in fields.items()
                   for spelling in (name, _camel(name))}

    def check(value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise _bad_value(where, f"type.googleapis.com/{type_name}", value)
        check_known(value, by_spelling, where)
        for name, field_value in value.items():
            if field_value is not None:
                by_spelling[name](field_value, f"{where}.{name}")

    return check


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


_FCM = "google.firebase.fcm.v1."

NOTIFICATION = message(_FCM + "Notification", {"title": string, "body": string,
                                               "image": string})
FCM_OPTIONS = message(_FCM + "FcmOptions", {"analytics_label": string})

COLOR = message("google.type.Color", {"red": number, "green": number, "blue": number,
                                      "alpha": number})
LIGHT_SETTINGS = message(_FCM + "LightSettings", {
    "color": COLOR, "light_on_duration": duration, "light_off_duration": duration,
})
ANDROID_NOTIFICATION = message(_FCM + "AndroidNotification", {
    "title": string, "body": string, "icon": string, "color": string, "sound": string,
    "tag": string, "click_action": string, "body_loc_key": string,
    "body_loc_args": repeated(string), "title_loc_key": string,
    "title_loc_args": repeated(string), "channel_id": string, "ticker": string,
    "sticky": boolean, "event_time": timestamp, "local_only": boolean,
    "notification_priority": enum(
        _FCM + "AndroidNotification.NotificationPriority", "PRIORITY_UNSPECIFIED",
        "PRIORITY_MIN", "PRIORITY_LOW", "PRIORITY_DEFAULT", "PRIORITY_HIGH", "PRIORITY_MAX"),
    "default_sound": boolean, "default_vibrate_timings": boolean,
    "default_light_settings": boolean, "vibrate_timings": repeated(duration),
    "visibility": enum(_FCM + "AndroidNotification.Visibility", "VISIBILITY_UNSPECIFIED",
                       "PRIVATE", "PUBLIC", "SECRET"),
    "notification_count": int32, "light_settings": LIGHT_SETTINGS, "image": string,
    "bypass_proxy_notification": boolean,
    "proxy": enum(_FCM + "AndroidNotification.Proxy", "PROXY_UNSPECIFIED", "ALLOW", "DENY",
                  "IF_PRIORITY_LOWERED"),
})
ANDROID = message(_FCM + "AndroidConfig", {
    "collapse_key": string,
    "priority": enum(_FCM + "AndroidMessagePriority", "NORMAL", "HIGH"),
    "ttl": duration, "restricted_package_name": string, "data": string_map,
    "notification": ANDROID_NOTIFICATION,
    "fcm_options": message(_FCM + "AndroidFcmOptions", {"analytics_label": string}),
    "direct_boot_ok": boolean, "bandwidth_constrained_ok": boolean,
    "restricted_satellite_ok": boolean,
})
APNS = message(_FCM + "ApnsConfig", {
    "headers": string_map, "payload": struct,
    "fcm_options": message(_FCM + "ApnsFcmOptions", {"analytics_label": string,
                                                    "image": string}),
    "live_activity_token": string,
})
WEBPUSH = message(_FCM + "WebpushConfig", {
    "headers": string_map, "data": string_map, "notification": struct,
    "fcm_options": message(_FCM + "WebpushFcmOptions", {"link": string,
                                                       "analytics_label": string}),
})

# The message's object fields, in both spellings, with their checks.
OBJECT_FIELDS: dict[str, Check] = {
    "notification": NOTIFICATION,
    "android": ANDROID,
    "apns": APNS,
    "webpush": WEBPUSH,
    "fcm_options": FCM_OPTIONS,
    "fcmOptions": FCM_OPTIONS,
}
