from __future__ import annotations

from django.urls import path
from orders.views import create_order

urlpatterns = [path("orders/", create_order)]
