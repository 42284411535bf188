// harness/main.cpp: main() of test programs built on the harness (target dtensor::harness_main).
#include "harness/main.h"

int main(int argc, char** argv) { return dtensor::testing::main(argc, argv); }
