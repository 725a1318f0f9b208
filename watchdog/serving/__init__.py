"""What the daemon serves: the REST API (``api``), the HTTP server and its Host check
(``http_server``, ``host_check``), Prometheus metrics (``metrics``), the published-snapshot holder the
handlers read (``publish``), the control mailbox that hands arm/disarm/silences to the loop
(``control``), the evidence's OpenAPI description (``evidence_doc``) and the ``[auth]`` section
(``config``). Handlers run on uvicorn's thread and only read the latest immutable snapshot. Layer 5: it
imports ``actions`` and the layers below, never ``daemon``, ``demo`` or ``cli``."""
