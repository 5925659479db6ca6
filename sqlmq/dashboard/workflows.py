"""The dashboard's workflow pages: the newest workflows, and one drawn as its graph, each
step a box coloured by its state and linked to its message (see :mod:`sqlmq.workflows`).
A page of its own: this module's routes and its two templates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import UnknownWorkflow
from ..workflows.records import StepStatus, WorkflowStatus
from . import views
from .context import Dashboard, endpoint
from .views import Problem

#: How many workflows the list shows.
LISTED = 200
#: A step's box in the drawing, and the gaps between columns and rows (pixels).
BOX_W, BOX_H, GAP_X, GAP_Y = 170, 46, 60, 18


@dataclass(frozen=True)
class Box:
    """A step placed in the drawing: its column is its depth (the longest chain of
    dependencies before it), its row its place among the steps of that depth."""

    step: StepStatus
    x: int
    y: int


@dataclass(frozen=True)
class Edge:
    """A dependency drawn from the right side of its box to the left side of the step's."""

    x1: int
    y1: int
    x2: int
    y2: int


def layout(status: WorkflowStatus) -> tuple[list[Box], list[Edge], int, int]:
    """The boxes and edges of ``status``'s graph, and the drawing's width and height."""
    depth: dict[str, int] = {}
    for s in status.steps:  # in the order added: a step's dependencies come before it
        depth[s.name] = 1 + max((depth.get(d, 0) for d in s.after), default=-1)
    rows: dict[int, int] = {}
    boxes: dict[str, Box] = {}
    for s in status.steps:
        col = depth[s.name]
        row = rows.get(col, 0)
        rows[col] = row + 1
        boxes[s.name] = Box(s, col * (BOX_W + GAP_X), row * (BOX_H + GAP_Y))
    edges = [Edge(boxes[d].x + BOX_W, boxes[d].y + BOX_H // 2, b.x, b.y + BOX_H // 2)
             for b in boxes.values() for d in b.step.after if d in boxes]
    width = (max(depth.values(), default=0) + 1) * (BOX_W + GAP_X) - GAP_X
    height = max(rows.values(), default=1) * (BOX_H + GAP_Y) - GAP_Y
    return list(boxes.values()), edges, width, height


def _step_json(s: StepStatus) -> dict[str, Any]:
    return {"name": s.name, "id": s.id, "queue": s.queue, "state": s.state, "after": s.after,
            "attempts": s.attempts, "error": s.error, "on_failure": s.on_failure}


@endpoint("page")
async def workflows(request: Request, dash: Dashboard) -> Response:
    return dash.render(request, "workflows.html", title="Workflows", nav="workflows",
                       found=await dash.broker.workflows(LISTED))


@endpoint("json")
async def workflows_json(request: Request, dash: Dashboard) -> Response:
    return JSONResponse([{"name": w.name, "steps": w.steps, "ended": w.ended,
                          "completed": w.completed, "created_at": w.created_at.isoformat()}
                         for w in await dash.broker.workflows(LISTED)])


async def _status(request: Request, dash: Dashboard) -> WorkflowStatus:
    name = views.one(request.query_params, "name", required=True)
    assert name is not None
    try:
        return await dash.broker.workflow_status(name)
    except UnknownWorkflow as exc:
        raise Problem(404, str(exc)) from None


@endpoint("page")
async def workflow(request: Request, dash: Dashboard) -> Response:
    status = await _status(request, dash)
    boxes, edges, width, height = layout(status)
    return dash.render(request, "workflow.html", title=f"Workflow {status.name}",
                       nav="workflows", status=status, boxes=boxes, edges=edges,
                       width=width, height=height, box_w=BOX_W, box_h=BOX_H)


@endpoint("json")
async def workflow_json(request: Request, dash: Dashboard) -> Response:
    status = await _status(request, dash)
    return JSONResponse({"name": status.name, "state": status.state,
                         "steps": [_step_json(s) for s in status.steps]})


routes = [
    Route("/workflows", workflows),
    Route("/api/workflows", workflows_json),
    Route("/workflow", workflow),
    Route("/api/workflow", workflow_json),
]

__all__ = ["layout", "routes"]
