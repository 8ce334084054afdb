"""The exactly-once runtime every stage runs on.

Clients, the transaction, the assignment, the one reader, the watches and the
committed-plus-pending map.
"""
