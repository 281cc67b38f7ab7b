"""An order service: FastAPI, SQLAlchemy 2 (asyncio, psycopg driver) and relayer.

``POST /orders`` stores the order, its ``OrderPlaced`` event (ordering key: the customer, so each
customer's events reach consumers in order) and an unordered confirmation request in one
transaction. The event is sent by ``relayer run`` workers; the confirmation is sent right after
the commit by an ``UnorderedDispatcher`` attached to the sessions (the workers recover it if
this process dies first). When the stock cannot be reserved, the request fails and the order
and both messages roll back together.

Run it with ``uvicorn --factory orders_service:create_app`` (see README.md).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Path, Request
from pydantic import BaseModel, Field
from sqlalchemy import DateTime, ForeignKey, String, func, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from relayer import Outbox, StoreSettings, UnorderedDispatcher, load_settings


class Base(DeclarativeBase):
    pass


class Product(Base):
    __tablename__ = "products"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    stock: Mapped[int]


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    customer_id: Mapped[str] = mapped_column(String(64), index=True)
    product_id: Mapped[str] = mapped_column(ForeignKey("products.id"))
    quantity: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class OrderSession(Session):
    """The sync Session under this app's AsyncSessions: the dispatcher hooks its commits only,
    once, instead of every Session of the process or each request's AsyncSession."""


class NewOrder(BaseModel):
    customer_id: str = Field(min_length=1, max_length=64)
    product_id: str = Field(min_length=1, max_length=64)
    quantity: int = Field(gt=0, le=1000)


class Stock(BaseModel):
    stock: int = Field(ge=0)


class PlacedOrder(BaseModel):
    id: uuid.UUID
    customer_id: str
    product_id: str
    quantity: int


async def open_session(request: Request) -> AsyncIterator[AsyncSession]:
    """A session per request (FastAPI dependency)."""
    sessions: async_sessionmaker[AsyncSession] = request.app.state.sessions
    async with sessions() as session:
        yield session


def sqlalchemy_url(dsn: str) -> str:
    """The store's libpq URL for SQLAlchemy's psycopg (3) driver, which relayer writes through."""
    return dsn.replace("postgresql://", "postgresql+psycopg://", 1)


def create_app(
    store: StoreSettings | None = None,
    *,
    events: str | None = None,
    confirmations: str | None = None,
) -> FastAPI:
    """The service for ``store`` (default: store ``ORDERS_STORE`` or 'orders' of the relayer
    settings). ``events`` and ``confirmations`` are the messages' destinations."""
    store = store or load_settings().store(os.environ.get("ORDERS_STORE", "orders"))
    events = events or os.environ.get("ORDERS_EVENTS", "orders.events")
    confirmations = confirmations or os.environ.get("ORDERS_CONFIRMATIONS", "orders.confirmations")
    outbox = Outbox(store)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = create_async_engine(sqlalchemy_url(store.require_dsn()))
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)  # a real service runs migrations
        app.state.sessions = async_sessionmaker(
            engine, sync_session_class=OrderSession, expire_on_commit=False
        )
        try:
            async with UnorderedDispatcher(outbox) as dispatcher:
                dispatcher.attach(OrderSession)
                yield
        finally:
            await engine.dispose()

    app = FastAPI(title="orders", lifespan=lifespan)

    @app.put("/products/{product_id}")
    async def set_stock(
        product_id: Annotated[str, Path(min_length=1, max_length=64)],
        stock: Stock,
        session: Annotated[AsyncSession, Depends(open_session)],
    ) -> Stock:
        """Create the product or replace its stock (how the README stocks the shop)."""
        async with session.begin():
            await session.merge(Product(id=product_id, stock=stock.stock))
        return stock

    @app.post("/orders", status_code=201)
    async def place_order(
        order: NewOrder, session: Annotated[AsyncSession, Depends(open_session)]
    ) -> PlacedOrder:
        async with session.begin():  # one transaction: the order, its messages, the stock
            placed = Order(
                customer_id=order.customer_id, product_id=order.product_id, quantity=order.quantity
            )
            session.add(placed)
            await session.flush()
            event = PlacedOrder.model_validate(placed, from_attributes=True)
            await outbox.write_async(
                session,
                destination=events,
                key=order.customer_id,  # a customer's events stay in order
                body=json.dumps({"type": "OrderPlaced", **event.model_dump(mode="json")}).encode(),
                headers={"event-type": "OrderPlaced"},
            )
            await outbox.write_async(  # no key: sent right after the commit, in no order
                session,
                destination=confirmations,
                body=json.dumps(
                    {"order_id": str(placed.id), "customer_id": order.customer_id}
                ).encode(),
                headers={"event-type": "ConfirmationRequested"},
            )
            # Reserve stock last: the product's row stays locked only until the commit.
            reserved = await session.execute(
                update(Product)
                .where(Product.id == order.product_id, Product.stock >= order.quantity)
                .values(stock=Product.stock - order.quantity)
            )
            if reserved.rowcount != 1:  # type: ignore[attr-defined]
                # Leaving the block with an exception rolls back the order and both messages.
                raise HTTPException(409, f"not enough stock of {order.product_id!r}")
        return event

    return app
