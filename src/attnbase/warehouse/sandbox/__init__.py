"""The SQL sandbox that ``attnbase sql`` and the service share: the read-only statement guard
(:mod:`.sql`), the query process that enforces time, memory and result limits (:mod:`.sqlproc`,
forked from :mod:`.zygote`), and the watchdog that interrupts a query in this process
(:mod:`.watchdog`).
"""
