mod budgets;
mod children;
mod context;
mod dependencies;
mod gates;
mod recovery;
mod support;
mod turn_loop;
