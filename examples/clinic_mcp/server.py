"""A small clinic's appointment calendar as an MCP server (the official SDK's ``MCPServer``).

    python examples/clinic_mcp/server.py                    # stdio: one process per client session
    python examples/clinic_mcp/server.py --http 8000        # streamable HTTP on 127.0.0.1:8000/mcp

Five tools: ``find_slots`` (a doctor's free hours on a day), ``book_appointment`` (assigns an
appointment id: ``V101``, ``V102``, ... in each session), and three that need an id an earlier call
returned: ``order_tests`` (its ``tests`` argument is an array of ``LabTest`` objects, a ``$ref`` in the
input schema), ``reschedule_appointment`` and ``cancel_appointment``. An unknown id, doctor or slot is
the SDK's ``ToolError``, whose message reaches the client. State is kept per MCP session as in
examples/shop_mcp: over stdio the process is the session; over HTTP each ``mcp-session-id`` has its
own calendar.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from dataclasses import dataclass, field

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError  # its message reaches the client; a plain exception's does not
from pydantic import BaseModel, Field

DOCTORS: dict[str, str] = {
    "dr-adams": "general practice",
    "dr-baker": "cardiology",
    "dr-chen": "dermatology",
    "dr-diaz": "paediatrics",
    "dr-evans": "general practice",
    "dr-fox": "orthopaedics",
    "dr-gupta": "neurology",
    "dr-hale": "ophthalmology",
}
DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday")
HOURS = ("09:00", "10:00", "11:00", "14:00", "15:00", "16:00")
TESTS = {"CBC": "full blood count", "LIPID": "lipid panel", "HBA1C": "glycated haemoglobin", "ECG": "electrocardiogram"}
FIRST_ID = 101
MAX_SESSIONS = 4096  # HTTP: the oldest session's calendar is dropped past this many

app = MCPServer("clinic", instructions="A clinic's calendar: find free slots, book, order tests, move or cancel.")


class LabTest(BaseModel):
    """One test to run at an appointment."""

    code: str = Field(description="the test's code: CBC, LIPID, HBA1C or ECG")
    fasting: bool = Field(default=False, description="the patient must come fasting")


@dataclass
class Calendar:
    """One session's appointments."""

    appointments: dict[str, dict] = field(default_factory=dict)
    next_id: int = FIRST_ID

    def taken(self, doctor: str, day: str) -> set[str]:
        return {
            a["time"]
            for a in self.appointments.values()
            if a["doctor"] == doctor and a["day"] == day and a["status"] != "cancelled"
        }


CALENDARS: OrderedDict[str, Calendar] = OrderedDict()


def calendar_of(ctx: Context) -> Calendar:
    """The calling session's calendar (over HTTP by its ``mcp-session-id``; stdio has one session)."""
    headers = getattr(ctx.request_context.request, "headers", None)
    key = headers.get("mcp-session-id", "") if headers is not None else "stdio"
    if key not in CALENDARS:
        CALENDARS[key] = Calendar()
        while len(CALENDARS) > MAX_SESSIONS:
            CALENDARS.popitem(last=False)
    return CALENDARS[key]


def _slot(doctor: str, day: str, time: str) -> None:
    if doctor not in DOCTORS:
        raise ToolError(f"unknown doctor {doctor!r}")
    if day not in DAYS:
        raise ToolError(f"day must be one of {', '.join(DAYS)}")
    if time not in HOURS:
        raise ToolError(f"time must be one of {', '.join(HOURS)}")


def _appointment(ctx: Context, appointment_id: str) -> dict:
    found = calendar_of(ctx).appointments.get(appointment_id)
    if found is None:
        raise ToolError(f"no appointment {appointment_id!r}")
    return found


@app.tool()
def find_slots(doctor: str, day: str, ctx: Context) -> dict:
    """A doctor's free hours on one weekday.

    Args:
        doctor: the doctor's id, e.g. "dr-adams".
        day: a weekday in lower case, e.g. "monday".
    """
    _slot(doctor, day, HOURS[0])
    taken = calendar_of(ctx).taken(doctor, day)
    return {"doctor": doctor, "day": day, "free": [h for h in HOURS if h not in taken]}


@app.tool()
def book_appointment(doctor: str, day: str, time: str, patient: str, ctx: Context) -> dict:
    """Book a free slot for a patient; returns the appointment with its id.

    Args:
        doctor: the doctor's id, e.g. "dr-adams".
        day: a weekday in lower case, e.g. "monday".
        time: an hour, e.g. "09:00".
        patient: the patient's name.
    """
    _slot(doctor, day, time)
    calendar = calendar_of(ctx)
    if time in calendar.taken(doctor, day):
        raise ToolError(f"{doctor} is not free on {day} at {time}")
    appointment_id = f"V{calendar.next_id}"
    calendar.next_id += 1
    calendar.appointments[appointment_id] = {
        "appointment_id": appointment_id,
        "doctor": doctor,
        "day": day,
        "time": time,
        "patient": patient,
        "status": "booked",
    }
    return dict(calendar.appointments[appointment_id])


@app.tool()
def order_tests(appointment_id: str, tests: list[LabTest], ctx: Context) -> dict:
    """Order lab tests to run at an appointment.

    Args:
        appointment_id: the id book_appointment returned, e.g. "V101".
        tests: the tests, one object each.
    """
    found = _appointment(ctx, appointment_id)
    unknown = [t.code for t in tests if t.code not in TESTS]
    if unknown or not tests:
        raise ToolError(f"unknown test codes {unknown}" if unknown else "order at least one test")
    found.setdefault("tests", []).extend(t.code for t in tests)
    fasting = any(t.fasting for t in tests)
    return {"appointment_id": appointment_id, "tests": list(found["tests"]), "fasting": fasting}


@app.tool()
def reschedule_appointment(appointment_id: str, day: str, time: str, ctx: Context) -> dict:
    """Move an appointment to another free slot with the same doctor.

    Args:
        appointment_id: the id book_appointment returned.
        day: the new weekday.
        time: the new hour.
    """
    found = _appointment(ctx, appointment_id)
    _slot(found["doctor"], day, time)
    if time in calendar_of(ctx).taken(found["doctor"], day):
        raise ToolError(f"{found['doctor']} is not free on {day} at {time}")
    found.update(day=day, time=time, status="rescheduled")
    return {k: found[k] for k in ("appointment_id", "doctor", "day", "time", "status")}


@app.tool()
def cancel_appointment(appointment_id: str, ctx: Context) -> dict:
    """Cancel an appointment.

    Args:
        appointment_id: the id book_appointment returned.
    """
    found = _appointment(ctx, appointment_id)
    found["status"] = "cancelled"
    return {"appointment_id": appointment_id, "status": "cancelled"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT/mcp")
    args = parser.parse_args()
    if args.http:
        app.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        app.run()


if __name__ == "__main__":
    main()
