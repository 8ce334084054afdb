"""The exactly-once runtime's pieces that stages share."""
