//! Schedules and wakes end to end (DESIGN.md §9 "Schedules and wakes"): the real binary,
//! real HTTP on loopback, `kill -9` of hosts and of `keel wake`, SQLite and a throwaway
//! PostgreSQL. Every slot fires at most once; a wake is applied once; nothing runs twice.

mod harness;

mod cli;
mod redteam;
mod sessions;
mod slots;
mod wakes;
