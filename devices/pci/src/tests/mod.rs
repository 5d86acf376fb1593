mod config;
mod function;
mod interrupt;
mod msix;
