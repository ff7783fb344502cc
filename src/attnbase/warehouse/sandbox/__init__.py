"""The SQL sandbox that ``attnbase sql`` and the service share: the read-only statement guard
(:mod:`.sql`), the query process that enforces time, memory and result limits (its caller
:mod:`.sqlproc`, what runs inside it :mod:`.querychild`, the frames between them
:mod:`.frames`, forked from :mod:`.zygote`), a failed query's error (:mod:`.sqlerrors`), and
the watchdog that interrupts a query in this process (:mod:`.watchdog`).
"""
