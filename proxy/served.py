"""Which model a request is for, and its decision service.

llama-server serves one model, or, started without one (router mode: ``--models-dir``
or ``--models-preset``), several, each in a child process of its own, routed by the
``model`` a request names. The proxy asks once which it is (``/props`` says ``role:
router``) and keeps one ``DecisionService`` per model: labels verified in that model's
chat template, its prompts, its slots, its content-free answers. Calibration profiles are
per model too (a profile names the model it was fitted for).

A request names a model by any name ``/v1/models`` lists for it (its id or an alias), or
by a name every decision API has a default for (``jev-latest``, ``gpt-6-luna``,
``--model-aliases``), or by none: those go to the default model, ``--default-model`` or
the first one llama-server lists. One model: every name the model answers to
(proxy/names.py) reaches it, and chat requests may name anything, as llama-server allows.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import ProxyError, UpstreamBadResponse
from .names import SDK_NAMES, ModelNames, model_names, parse_aliases
from .service import DecisionService
from .upstream import ModelInfo, Upstream

__all__ = ["ServedModels", "UnknownModel"]

_MAX_MODELS = 64  # services kept: a router lists what its folder or preset holds


class UnknownModel(LookupError):
    """A name no served model answers to; ``names`` lists those that do."""

    def __init__(self, name: str | None, names: tuple[str, ...]):
        super().__init__(name)
        self.name, self.names = name, names

    def message(self) -> str:
        return f"unknown model {self.name!r}; this server answers as {list(self.names)}"


class ServedModels:
    def __init__(
        self,
        upstream: Upstream,
        make: Callable[[Upstream], DecisionService],
        *,
        default_model: str = "",
        aliases: str = "",
    ):
        self._upstream = upstream
        self._make = make
        self._default_name = default_model
        self._configured = parse_aliases(aliases)
        self._router: bool | None = None  # asked once llama-server answers
        self._listed: tuple[ModelInfo, ...] = ()  # a router's models, as last listed
        self._services: dict[str, DecisionService] = {}
        self._single = make(upstream)  # one model: every request's service

    async def router(self) -> bool:
        """Whether llama-server serves several models (router mode)."""
        if self._router is None:
            self._router = await self._upstream.is_router()
        return self._router

    @property
    def several(self) -> bool:
        """A router was found (known after the first ``service``)."""
        return bool(self._router)

    def default_service(self) -> DecisionService:
        """One model's service; with a router, the one built first (for the slot count
        and the like, which do not depend on the model). Use ``service`` to route."""
        return next(iter(self._services.values()), self._single)

    async def service(self, name: str | None, *, strict: bool = True) -> DecisionService:
        """The service of the model ``name`` is for. One model: the names it answers to
        (``strict``) or any name (chat requests); a router: a name of one of its models
        or a default name. Raises ``UnknownModel``."""
        if not await self.router():
            if strict and name is not None:
                names = self.names_of(await self._single.discovery.model(), default=True)
                if not names.accepts(name):
                    raise UnknownModel(name, names.listed)
            return self._single
        model_id = await self._resolve(name)
        service = self._services.get(model_id)
        if service is None:
            if len(self._services) >= _MAX_MODELS:
                raise UpstreamBadResponse(f"llama-server lists more than {_MAX_MODELS} models")
            service = self._services[model_id] = self._make(self._upstream.for_model(model_id))
        return service

    async def settled(self) -> bool:
        """Whether the one model's self-check has settled (``SelfCheck.settled``),
        starting it when due. A router's models are checked when each first decides."""
        if await self.router():
            return True
        return await self._single.self_check.settled()

    async def close(self) -> None:
        """Stop every model's self-check (a shutdown)."""
        for service in {self._single, *self._services.values()}:
            await service.close()

    def checks(self) -> dict[str, dict[str, object]]:
        """Each model's repeatability self-check (decision/selfcheck.py) by model id: the
        one model's, or a router's models that have answered a decision."""
        if not self._router:
            info = self._single.discovery.known
            return {info.id if info else "": self._single.self_check.result.as_json()}
        return {model: s.self_check.result.as_json() for model, s in self._services.items()}

    async def listed(self) -> tuple[ModelInfo, ...]:
        """A router's models as ``/v1/models`` lists them (no model is loaded to learn it)."""
        found = (await self._upstream.models_list()).models
        if not found:
            raise UpstreamBadResponse("llama-server's /v1/models answer names no model")
        self._listed = found
        return found

    async def default_id(self) -> str:
        """A router's default model: ``--default-model``, else the first listed."""
        listed = self._listed or await self.listed()
        if self._default_name:
            for entry in listed:
                if self._default_name == entry.id or self._default_name in entry.aliases:
                    return entry.id
            # the server's configuration, not the request: a 500 that names the setting
            raise ProxyError(
                f"PROXY_DEFAULT_MODEL is {self._default_name!r}, which "
                f"llama-server does not list ({[e.id for e in listed]})",
                code="default_model_not_served",
            )
        return listed[0].id

    def names_of(self, info: ModelInfo, *, default: bool) -> ModelNames:
        """What requests may call the model ``info``: the default model also answers to
        the APIs' default names and the configured aliases (proxy/names.py)."""
        names = model_names(info.id, info.aliases, info.path, self._configured if default else ())
        if default:
            return names
        return ModelNames(tuple(n for n in names.listed if n not in SDK_NAMES), names.path)

    async def _resolve(self, name: str | None) -> str:
        if name is None or name in SDK_NAMES or name in self._configured:
            return await self.default_id()
        found = _find(self._listed or await self.listed(), name)
        if found is None:  # not seen yet: the router's list may have grown
            found = _find(await self.listed(), name)
        if found is None:
            names = [
                *SDK_NAMES,
                *self._configured,
                *(n for e in self._listed for n in (e.id, *e.aliases)),
            ]
            raise UnknownModel(name, tuple(dict.fromkeys(names)))
        return found


def _find(listed: tuple[ModelInfo, ...], name: str) -> str | None:
    for entry in listed:
        if name == entry.id or name in entry.aliases:
            return entry.id
    return None
