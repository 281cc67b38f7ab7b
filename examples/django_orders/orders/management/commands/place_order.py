from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from orders.services import place_order


class Command(BaseCommand):
    help = "Place an order: the order row and its OrderPlaced event commit together."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("customer")
        parser.add_argument("amount", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            order = place_order(options["customer"], options["amount"])
        except ValueError as exc:
            raise CommandError(f"{exc}; nothing was written") from exc
        self.stdout.write(f"order {order.pk} placed for {order.customer}")
