from __future__ import annotations

from django.db import models


class Order(models.Model):
    customer = models.CharField(max_length=100)
    amount = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
