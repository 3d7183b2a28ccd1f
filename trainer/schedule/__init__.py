"""Pipeline schedules as data, their validator, simulator and Chrome-trace export."""
