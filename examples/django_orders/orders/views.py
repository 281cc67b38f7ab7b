"""POST /orders/ with customer and amount: places the order (see services.place_order)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_POST

from orders.services import place_order


@require_POST
def create_order(request: HttpRequest) -> HttpResponse:
    try:
        order = place_order(request.POST["customer"], int(request.POST["amount"]))
    except (KeyError, ValueError) as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({"id": order.pk}, status=201)
