"""What every layer shares: RocketMQ's ``common`` module (names, flags, limits and the route model).

=====================================  =================================================================
module                                 content (RocketMQ class)
=====================================  =================================================================
:mod:`rmq.common.topic_validator`      ``check_topic``, ``check_group``, ``check_queue_id`` and their limits
                                       (``TopicValidator`` / client ``Validators``), ``RMQ_SYS_TRACE_TOPIC``
:mod:`rmq.common.perm`                 ``PERM_PRIORITY`` / ``PERM_READ`` / ``PERM_WRITE`` / ``PERM_INHERIT``,
                                       ``is_readable`` ... ``perm_to_string`` (``PermName``)
:mod:`rmq.common.mix_all`              ``MASTER_ID`` (an int), ``%RETRY%`` / ``%DLQ%`` prefixes,
                                       ``retry_topic`` / ``dlq_topic``, tool group names (``MixAll``)
:mod:`rmq.common.pull_sys_flag`        ``PULL_FLAG_*``, ``build_sys_flag``, ``has_*_flag`` (``PullSysFlag``)
:mod:`rmq.common.request_header`       ``SendMessageRequestHeader``, ``PullMessageRequestHeader``: the header
                                       fields of the codes several clients build (``common/protocol/header``)
:mod:`rmq.common.message_const`        message property names (``KEYS``, ``TAGS``, ``UNIQ_KEY``, timers,
                                       ``__SHARDINGKEY`` ...) and ``RESERVED_PROPERTIES`` (``MessageConst``)
:mod:`rmq.common.route`                ``QueueData``, ``BrokerData``, ``TopicRouteData`` and their wire forms
                                       (``common/protocol/route``); broker ids are ints in memory, decimal
                                       strings on the wire
=====================================  =================================================================

The rule: ``rmq.common`` imports no client, store, actor or proxy module -- only the standard
library, :mod:`rmq.errors`, the constants of :mod:`rmq._core.layout` and itself -- so producers,
consumers, the admin, the broker, the NameServer and the proxy can all import it without pulling
each other in (tests/unit/test_common.py checks the import graph).
"""
