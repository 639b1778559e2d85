def fibonacci(n):
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def main():
    for i in range(10):
        print(i, fibonacci(i))


if __name__ == "__main__":
    main()
