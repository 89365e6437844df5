mod budgets;
mod children;
mod dependencies;
mod gates;
mod recovery;
mod support;
mod turn_loop;
