#include <gtest/gtest.h>
TEST(Placeholder, Todo) { FAIL(); }
